"""Meshes that span several processes: the cluster spec and its start-up.

One process per host, each with its local devices (logical CPUs, GPUs).  Every
process runs the same Python program (multi-client SPMD): it builds the same
graph, traces the same per-device program for its own devices, and the
processes meet in TensorFlow's collective ops over gRPC.

The cluster is described the way TensorFlow users already describe one, a
``TF_CONFIG`` JSON document::

    {"cluster": {"worker": ["host0:2222", "host1:2222"]},
     "task": {"type": "worker", "index": 0}}

Start-up goes through DTensor's public multi-client initializer
(``tf.experimental.dtensor.initialize_accelerator_system``): it starts this
task's gRPC server, the coordination service and cross-task collectives, which
is exactly what raw collective ops need.  Nothing else of DTensor is used.

>>> spec = ClusterSpec.from_tf_config(
...     '{"cluster": {"worker": ["localhost:2222", "localhost:2223"]},'
...     ' "task": {"type": "worker", "index": 1}}')
>>> cluster_devices(spec, 2)[2]
'/job:worker/replica:0/task:1/device:CPU:0'
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtf_core.errors import LoweringError

#: Environment variable the launcher sets: local devices per process.
DEVICES_PER_PROCESS_ENV = "MTF_DEVICES_PER_PROCESS"

# The cluster this process joined (the process's identity, like TF's own
# context: there is one per process and it cannot change once started).
_active: ClusterSpec | None = None


@dataclass(frozen=True)
class ClusterSpec:
    """The tasks of one job, in task order, and which one this process is."""

    addresses: tuple[str, ...]
    task_index: int
    job: str = "worker"

    def __post_init__(self) -> None:
        object.__setattr__(self, "addresses", tuple(self.addresses))
        if not self.addresses:
            raise LoweringError("cluster spec lists no tasks")
        if not 0 <= self.task_index < len(self.addresses):
            raise LoweringError(
                f"task index {self.task_index} is out of range for a cluster of "
                f"{len(self.addresses)} tasks ({list(self.addresses)})"
            )
        for a in self.addresses:
            host, _, port = a.rpartition(":")
            if not host or not port.isdigit():
                raise LoweringError(
                    f"cluster address {a!r} is not of the form 'host:port'"
                )

    @property
    def num_processes(self) -> int:
        return len(self.addresses)

    @classmethod
    def from_tf_config(cls, tf_config: str | Mapping[str, Any]) -> ClusterSpec:
        """Parses a ``TF_CONFIG`` document (JSON text or a dict) of one job."""
        try:
            cfg = json.loads(tf_config) if isinstance(tf_config, str) else tf_config
            cluster = dict(cfg["cluster"])
            task = dict(cfg["task"])
        except (ValueError, KeyError, TypeError) as e:
            raise LoweringError(
                f"TF_CONFIG {tf_config!r} is not a JSON object with 'cluster' and "
                f"'task' entries ({e})"
            ) from None
        if len(cluster) != 1:
            raise LoweringError(
                f"TF_CONFIG cluster has jobs {sorted(cluster)}; an mtf mesh runs on "
                "one job of peer tasks, e.g. {'worker': ['host0:2222', ...]}"
            )
        ((job, addresses),) = cluster.items()
        if task.get("type", job) != job:
            raise LoweringError(
                f"TF_CONFIG task type {task.get('type')!r} is not the cluster's job "
                f"{job!r}"
            )
        return cls(tuple(addresses), int(task.get("index", 0)), job)

    def to_tf_config(self) -> str:
        return json.dumps(
            {
                "cluster": {self.job: list(self.addresses)},
                "task": {"type": self.job, "index": self.task_index},
            }
        )


def cluster_devices(
    spec: ClusterSpec, devices_per_process: int, device_type: str = "CPU"
) -> list[str]:
    """Every device of the cluster, task by task: the device list of a mesh
    whose first axis runs across processes."""
    return [
        f"/job:{spec.job}/replica:0/task:{t}/device:{device_type}:{i}"
        for t in range(spec.num_processes)
        for i in range(devices_per_process)
    ]


def initialize(
    spec: ClusterSpec, devices_per_process: int, device_type: str = "CPU"
) -> list[str]:
    """Joins the cluster as task ``spec.task_index`` with ``devices_per_process``
    local devices; returns every device of the cluster (see
    :func:`cluster_devices`).  Call once, before any other TensorFlow work;
    returns when every task has joined."""
    import tensorflow as tf  # here, so the launcher can parse specs without TF

    global _active
    if _active is not None:
        if _active == spec:
            return cluster_devices(spec, devices_per_process, device_type)
        raise LoweringError(
            f"this process already joined cluster {_active}; cannot join {spec}"
        )
    device_type = device_type.upper()
    if device_type not in ("CPU", "GPU"):
        raise LoweringError(f"device type {device_type!r}: expected 'CPU' or 'GPU'")
    if device_type == "GPU":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise LoweringError("device type 'GPU' asked for, but no GPU is visible")
        if devices_per_process > len(gpus):
            # More mesh devices than GPUs: split the first one into logical GPUs.
            tf.config.set_logical_device_configuration(
                gpus[0],
                [tf.config.LogicalDeviceConfiguration(memory_limit=4096)]
                * devices_per_process,
            )
    os.environ["DTENSOR_JOBS"] = ",".join(spec.addresses)
    os.environ["DTENSOR_CLIENT_ID"] = str(spec.task_index)
    os.environ["DTENSOR_JOB_NAME"] = spec.job
    tf.experimental.dtensor.initialize_accelerator_system(
        device_type,
        num_logical_cpu_devices=devices_per_process if device_type == "CPU" else None,
    )
    _active = spec
    return cluster_devices(spec, devices_per_process, device_type)


def initialize_from_env(devices_per_process: int | None = None) -> list[str] | None:
    """Joins the cluster that ``TF_CONFIG`` describes (what :mod:`launcher`
    sets); returns its devices, or None when ``TF_CONFIG`` is unset."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    if devices_per_process is None:
        devices_per_process = int(os.environ.get(DEVICES_PER_PROCESS_ENV, "1"))
    return initialize(ClusterSpec.from_tf_config(raw), devices_per_process)


def active_cluster() -> ClusterSpec | None:
    """The cluster this process joined, if any."""
    return _active


def local_task() -> tuple[str, int]:
    """``(job, task index)`` of this process: device names without a job and
    task mean this one."""
    if _active is None:
        return ("localhost", 0)
    return (_active.job, _active.task_index)

"""Logical devices: split the host CPU into N TensorFlow devices."""

from __future__ import annotations

import tensorflow as tf

from mtf_core.errors import LoweringError


def logical_cpu_devices(n: int = 8) -> list[str]:
    """Splits the CPU into ``n`` logical devices (once per process) and returns
    their names.  Must run before TensorFlow initializes its devices; calling it
    again with a smaller or equal ``n`` returns the first ``n`` (a larger one
    before TensorFlow has run adds devices).

    The split is configured, not started: TensorFlow starts its runtime, and
    its thread pools, at its first op.  So a program that takes its devices
    first runs no thread of TensorFlow's until it lowers, and may fork before
    that (a planner's search workers do)."""
    (cpu, *_) = tf.config.list_physical_devices("CPU")
    configured = len(tf.config.get_logical_device_configuration(cpu) or ())
    if configured < n:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
            )
            configured = n
        except RuntimeError:
            pass  # already initialized
    if configured >= n:  # TensorFlow names them so, started or not
        return [f"/device:CPU:{i}" for i in range(n)]
    logical = tf.config.list_logical_devices("CPU")
    if len(logical) < n:
        raise LoweringError(
            f"asked for {n} logical CPU devices but TensorFlow was already set up "
            f"with {len(logical)}; call logical_cpu_devices before any TF work"
        )
    return [d.name for d in logical[:n]]


def logical_gpu_devices(n: int, memory_mb: int = 4096) -> list[str]:
    """Splits the first GPU into ``n`` logical GPUs (when there is one)."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise LoweringError("no GPU is visible to TensorFlow")
    try:
        tf.config.set_logical_device_configuration(
            gpus[0],
            [
                tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)
                for _ in range(n)
            ],
        )
    except RuntimeError:
        pass
    logical = tf.config.list_logical_devices("GPU")
    if len(logical) < n:
        raise LoweringError(
            f"asked for {n} logical GPUs, TensorFlow has {len(logical)}"
        )
    return [d.name for d in logical[:n]]

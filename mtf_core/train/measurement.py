"""Measuring a compiled step, and reporting it for the plan it ran.

:func:`measure_step` times any compiled step (``mtf.compile_function``'s, or
a :class:`~mtf_core.lowering.training.Trainer`'s): a warm-up call, then the
fastest of ``steps`` calls, in wall seconds and in CPU seconds per usable
core (the wall time an otherwise idle host would show; see
``mtf_core.lowering.calibrate.CLOCKS``).  :meth:`StepMeasurement.report_body`
is the body of the planner service's ``POST /v1/measurements``; the service
stores it next to the plan's prediction and refits the plan's hardware
profile.  Sending it is the planner client's job (``report_measurement``,
declared by the ``api`` package as an ``mtf`` extension), so this module
speaks no HTTP.

>>> # doctest: +SKIP
>>> m = measure_step(step, [x, y], steps=5, backend="placement")
>>> mtf.report_measurement("http://127.0.0.1:8080", plan_id, m)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from mtf_core.errors import ConfigError


@dataclass(frozen=True)
class StepMeasurement:
    """Fastest step of a run: wall seconds, and CPU seconds per usable core."""

    wall_s: float
    cpu_s: float
    steps: int
    backend: str = "placement"
    clock: str = "wall"
    mesh_shape: str = ""
    layout_rules: str = ""
    #: Seconds per op class per step (:mod:`mtf_core.lowering.op_profile`).
    op_profile: Mapping[str, float] | None = None

    @property
    def step_s(self) -> float:
        """The step time under :attr:`clock`."""
        return self.wall_s if self.clock == "wall" else self.cpu_s

    def report_body(self, plan_id: str, source: str = "") -> dict[str, Any]:
        """The ``POST /v1/measurements`` body for the plan ``plan_id``."""
        return {
            "plan_id": plan_id,
            "step_s": self.step_s,
            "backend": self.backend,
            "steps": self.steps,
            "source": source or f"mtf {self.clock} clock, {self.layout_rules}",
            "profile": dict(self.op_profile or {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"step_s": self.step_s}


def measure_step(
    step: Callable[..., Any],
    args: Sequence[Any] = (),
    steps: int = 5,
    backend: str = "placement",
    clock: str = "wall",
    cores: int | None = None,
    mesh_shape: str = "",
    layout_rules: str = "",
    profile_ops: int = 0,
) -> StepMeasurement:
    """Calls ``step(*args)`` once to warm up, then ``steps`` times; returns the
    fastest call.  ``cores``: the cores the devices can keep busy (default:
    the CPUs this process may run on), which CPU seconds are divided by.
    ``profile_ops``: that many more calls under TensorFlow's profiler, for
    the seconds per op class (not timed: the profiler slows them)."""
    if steps < 1:
        raise ConfigError(f"steps must be at least 1, got {steps}")
    if clock not in ("wall", "cpu"):
        raise ConfigError(f"clock {clock!r}; expected 'wall' or 'cpu'")
    if backend not in ("placement", "spmd"):
        raise ConfigError(f"backend {backend!r}; expected 'placement' or 'spmd'")
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    step(*args)
    wall, cpu = float("inf"), float("inf")
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step(*args)
        wall = min(wall, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    op_profile = None
    if profile_ops:
        from mtf_core.lowering.op_profile import profiling

        with profiling() as prof:
            for _ in range(profile_ops):
                step(*args)
        op_profile = prof.per_step(profile_ops)
    return StepMeasurement(
        wall,
        cpu / max(cores, 1),
        steps,
        backend,
        clock,
        mesh_shape,
        layout_rules,
        op_profile,
    )

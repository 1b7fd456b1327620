"""Pipeline schedules: stages and micro-batches, and the order of each
stage's work.

A unit (:class:`Work`) is one stage's forward (``"F"``) or backward (``"B"``)
work on one micro-batch.  Schedules (:func:`stage_orders`), each stage's
order of units:

* ``"gpipe"``: every micro-batch's forward, then every backward;
* ``"1f1b"``: ``p - 1 - s`` forwards to fill the pipeline, then one forward
  and one backward alternately, then the remaining backwards: a stage holds
  at most ``p`` micro-batches' activations (:func:`in_flight`).

:func:`global_order` merges them into one order that every stage and every
data dependency keeps: the order :func:`mtf_core.pipeline.build_pipelined_lm`
builds the step in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mtf_core.errors import ConfigError, GraphError

SCHEDULES = ("gpipe", "1f1b")


class PipelineConfigError(ConfigError):
    """A pipeline that cannot be built as asked (names the value)."""


@dataclass(frozen=True)
class PipelineStages:
    """``stages`` positions of mesh axis ``axis``, ``micro_batches`` per step,
    and the schedule (``"gpipe"`` or ``"1f1b"``)."""

    stages: int
    micro_batches: int
    schedule: str = "1f1b"
    axis: str = "pp"

    def __post_init__(self) -> None:
        for f in ("stages", "micro_batches"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PipelineConfigError(
                    f"pipeline {f} must be an integer >= 1, got {v!r}"
                )
        if self.schedule not in SCHEDULES:
            raise PipelineConfigError(
                f"pipeline schedule {self.schedule!r} is unknown; expected one of "
                f"{list(SCHEDULES)}"
            )

    def check(self, num_layers: int, batch: int) -> None:
        """Raises unless ``num_layers`` layers and a batch of ``batch`` cut
        evenly into the stages and micro-batches."""
        if self.stages > num_layers or num_layers % self.stages:
            raise PipelineConfigError(
                f"{self.stages} pipeline stages do not divide {num_layers} layers; "
                "expected a divisor of the layer count"
            )
        if batch % self.micro_batches:
            raise PipelineConfigError(
                f"{self.micro_batches} micro-batches do not divide the batch of "
                f"{batch}; expected a divisor of the batch"
            )


@dataclass(frozen=True)
class Work:
    """One unit of a pipelined step: stage ``stage``'s forward (``"F"``) or
    backward (``"B"``) work on micro-batch ``micro_batch``."""

    stage: int
    micro_batch: int
    phase: str

    def __str__(self) -> str:
        return f"{self.phase}{self.micro_batch}@{self.stage}"


def stage_orders(spec: PipelineStages) -> list[list[Work]]:
    """Each stage's units in the order the schedule runs them."""
    p, m = spec.stages, spec.micro_batches
    orders = []
    for s in range(p):
        fwd = [Work(s, j, "F") for j in range(m)]
        bwd = [Work(s, j, "B") for j in range(m)]
        if spec.schedule == "gpipe":
            orders.append(fwd + bwd)
            continue
        warm = min(p - 1 - s, m)
        order = fwd[:warm]
        for k in range(m - warm):
            order += [fwd[warm + k], bwd[k]]
        orders.append(order + bwd[m - warm :])
    return orders


def in_flight(order: Sequence[Work]) -> int:
    """The most micro-batches whose forward has run and backward not yet, over
    one stage's order: the activations the stage holds at once."""
    held = most = 0
    for w in order:
        held += 1 if w.phase == "F" else -1
        most = max(most, held)
    return most


def global_order(spec: PipelineStages) -> list[Work]:
    """All units in one order that keeps each stage's order and every data
    dependency (a forward after the previous stage's, a backward after the
    next stage's): the order the step is built in, so every edge of the
    built graph (control dependencies included) points backwards."""
    orders = stage_orders(spec)
    done: set[Work] = set()
    pos = [0] * spec.stages
    out: list[Work] = []
    last = spec.stages - 1
    while len(out) < sum(map(len, orders)):
        progressed = False
        for s in range(spec.stages):
            if pos[s] == len(orders[s]):
                continue
            w = orders[s][pos[s]]
            if w.phase == "F":
                need = Work(s - 1, w.micro_batch, "F") if s > 0 else None
            else:
                need = Work(s + 1, w.micro_batch, "B") if s < last else None
            if need is None or need in done:
                out.append(w)
                done.add(w)
                pos[s] += 1
                progressed = True
        if not progressed:  # an invariant of stage_orders, not user input
            raise GraphError(f"pipeline schedule {spec.schedule!r} deadlocks")
    return out

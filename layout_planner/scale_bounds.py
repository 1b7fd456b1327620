"""Lower bounds on a pipelined step, for ordering and pruning the mesh search.

The scale search (:mod:`layout_planner.scale_search`) tries meshes
``pp x dp x tp`` in order of a lower bound and stops when no remaining mesh's
bound beats the best step found.  The tighter the bound, the fewer meshes are
tried; it must never exceed what a trial on that mesh can cost, or the search
would skip the best mesh.

The bound here is the roofline of the stage's own ops with every op's work
spread perfectly over the stage's ``dp * tp`` devices::

    lb(op)   = max(flops / (D * peak), bytes / (D * hbm_bw)),   D = dp * tp
    step    >= (m + pp - 1) * sum_{op < update} lb(op) + sum_{op >= update} lb(op)

Why it is a bound: the cost model prices an op on a device as
``max(flops_dev / peak, bytes_dev / hbm_bw)`` (:mod:`cost_models.op_costs`)
with ``flops_dev = flops / (devices splitting it) >= flops / D`` and every
slice at least ``1 / D`` of its tensor; collectives, sends and the bubble's
other terms only add (``cost_models.pipeline``: ``(m + p - 1) (t_mb + 2
t_send) + t_once``).  Recomputation only adds ops, so the graph that keeps
every activation bounds every recomputation option.

The op sums are taken from the stage graph at one micro-batch, whose size
(``dp`` sequences) and depth (``L / pp`` layers) change from mesh to mesh.
Both are affine in the batch and in the layers for the Transformers built
here, so four small graphs (2 and 3 layers, batch 1 and 2) give every mesh's
sums; two more (2 layers at batch 3, 4 layers at batch 1) check both
affinities, and where they do not hold (or the profile is calibrated, whose per-op overheads are not
a roofline) the bound falls back to the model's flops at peak.

Ignored, so the bound stays below every trial: communication, memory (a mesh
that cannot fit without recomputing is bounded as if it could), the
duplicated work of ops no layout splits ``D`` ways.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cost_models.hardware import HardwareProfile
from cost_models.op_costs import hbm_bytes_per_device
from mtf_core.comm import LayoutContext
from mtf_core.liveness import step_operations
from mtf_core.models import TransformerConfig
from mtf_core.models.base import ModelGraph

__all__ = ["StepBound", "flops_bound_s"]

#: Relative tolerance of the batch-affinity check (the same float sums in
#: another order).
_AFFINE_TOL = 1e-9


@dataclass(frozen=True)
class _OpWork:
    """One op's flops and HBM bytes, and whether it runs once per step."""

    once: bool
    flops: float
    nbytes: float


def _work(model: ModelGraph) -> list[_OpWork]:
    ops = model.graph.operations
    first_update = next(i for i, op in enumerate(ops) if op.name == "global_step")
    index = {op: i for i, op in enumerate(ops)}
    whole = LayoutContext.make("all:1", "")  # one device: every tensor whole
    return [
        _OpWork(
            index[op] >= first_update,
            op.flops(),
            float(hbm_bytes_per_device(op, whole)),
        )
        for op in step_operations(model.graph, [model.loss])
    ]


class StepBound:
    """Lower bounds on the pipelined step of ``cfg``'s stages on any mesh.

    >>> from cost_models.profiles import get_hardware
    >>> from mtf_core.models import build_lm
    >>> cfg = TransformerConfig(num_layers=4, d_model=64, heads=2, d_kv=32,
    ...                         d_ff=128, vocab=256, length=16, batch=8)
    >>> hw = get_hardware("h100-nvlink-ib")
    >>> b = StepBound(cfg, build_lm, "adam", hw, model_flops=1e9)
    >>> b.roofline
    True
    >>> b.bound_s(stages=2, data=2, tensor=2, micro_batches=4) > 0
    True
    """

    def __init__(
        self,
        cfg: TransformerConfig,
        builder: Callable[..., ModelGraph],
        optimizer: str,
        hw: HardwareProfile,
        model_flops: float,
    ) -> None:
        self.cfg = cfg
        self.hw = hw
        self.model_flops = model_flops
        self._work: dict[tuple[int, int], list[_OpWork]] = {}
        #: Whether bounds are the roofline's (else the flops at peak).
        self.roofline = hw.rates is None and self._measure(builder, optimizer)

    def _measure(self, builder: Callable[..., ModelGraph], optimizer: str) -> bool:
        """Builds the small graphs; False where sums are not affine as assumed."""
        points = ((2, 1), (2, 2), (3, 1), (3, 2), (2, 3), (4, 1))
        for layers, batch in points:
            model = builder(
                self.cfg.replace(
                    num_layers=layers,
                    batch=batch,
                    recompute_attention="none",
                    recompute_ffn="none",
                ),
                optimizer=optimizer,
            )
            self._work[(layers, batch)] = _work(model)
        for layers in (2, 3):  # op by op, batch 1 against batch 2
            if len(self._work[(layers, 1)]) != len(self._work[(layers, 2)]):
                return False
        if len(self._work[(2, 3)]) != len(self._work[(2, 1)]):
            return False
        checks = [
            (self._sums(2, 3, 1), self._direct(2, 3)),  # affine in the batch
            (self._layers(4, 1, 1), self._direct(4, 1)),  # affine in the layers
        ]
        return all(
            abs(g - w) <= _AFFINE_TOL * max(w, 1e-30)
            for got, want in checks
            for g, w in zip(got, want)
        )

    def _roof(self, w: _OpWork, devices: int) -> float:
        hw = self.hw
        return max(
            w.flops / (devices * hw.peak_flops),
            w.nbytes / (devices * hw.hbm_bandwidth_bytes_per_s),
        )

    def _direct(self, layers: int, batch: int) -> tuple[float, float]:
        work = self._work[(layers, batch)]
        return (
            sum(self._roof(w, 1) for w in work if not w.once),
            sum(self._roof(w, 1) for w in work if w.once),
        )

    def _sums(self, layers: int, batch: int, devices: int) -> tuple[float, float]:
        """(per-micro-batch, once-per-step) roofline sums of the ``layers``-layer
        graph at ``batch`` on ``devices``, op by op from batch 1 and 2."""
        per_mb = once = 0.0
        for a, b in zip(self._work[(layers, 1)], self._work[(layers, 2)]):
            w = _OpWork(
                a.once,
                a.flops + (batch - 1) * (b.flops - a.flops),
                a.nbytes + (batch - 1) * (b.nbytes - a.nbytes),
            )
            t = self._roof(w, devices)
            if w.once:
                once += t
            else:
                per_mb += t
        return per_mb, once

    def _layers(self, layers: int, batch: int, devices: int) -> tuple[float, float]:
        """:meth:`_sums` of a ``layers``-layer stage, from 2 and 3 layers."""
        mb2, once2 = self._sums(2, batch, devices)
        mb3, once3 = self._sums(3, batch, devices)
        extra = layers - 2
        return mb2 + extra * (mb3 - mb2), once2 + extra * (once3 - once2)

    def bound_s(self, stages: int, data: int, tensor: int, micro_batches: int) -> float:
        """No trial on ``pp x dp x tp`` with ``micro_batches`` is faster."""
        m, pp = micro_batches, stages
        if not self.roofline:
            return flops_bound_s(self.model_flops, self.hw, data * tensor * pp, m, pp)
        per_mb, once = self._layers(
            self.cfg.num_layers // pp, self.cfg.batch // m, data * tensor
        )
        return (m + pp - 1) * per_mb + once


def flops_bound_s(
    flops: float, hw: HardwareProfile, devices: int, micro_batches: int, stages: int
) -> float:
    """The model's flops at peak on every device, stretched by the bubble."""
    m, pp = micro_batches, stages
    return flops / (devices * hw.peak_flops) * (m + pp - 1) / m

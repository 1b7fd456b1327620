"""The kernels of planned stage steps, for timing on a GPU.

For each reference model that ``bench/scale.py`` puts on H100s, the plan
(and the published layout, or the plan made on another profile, or the
plans with given micro-batch counts) becomes its stage graph's step: every
op at its per-device slice shapes and dtypes, once per distinct signature,
with its cost-model features and roofline seconds on the ``h100-nvlink-ib``
preset, and each case's ops in step order.  ``bench/torch_kernels.py`` runs
them; ``bench/gpu_kernels.py`` is the command line and the report.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mtf_core import dtypes

#: The cases of bench/scale.py that run on H100s (the preset measured here).
H100_CASES = ("llama64", "llama512", "moe")
#: Op types torch_kernels.py mirrors kernel for kernel; any other op that
#: makes GPU work runs as a stand-in of the same bytes (``proxy``).
MIRRORED = frozenset(
    {
        "Einsum",
        "Binary",
        "Unary",
        "Cast",
        "Reduce",
        "AddN",
        "Broadcast",
        "Assign",
        "Where",
    }
)
#: Fed inputs: read, not computed.  (Ops of class None, constants and
#: identities, make no TensorFlow work and are left out too.)
SKIPPED = frozenset({"ImportTensor"})


def _tensor(ctx: Any, t: Any) -> dict[str, Any]:
    return {
        "dims": list(t.shape.dimension_names),
        "shape": ctx.slice_shape(t.shape),
        "dtype": str(t.dtype),
    }


def _fn(op: Any) -> str | None:
    for attr in ("fn_name", "reduction", "mode"):
        got = getattr(op, attr, None)
        if isinstance(got, str):
            return got
    return None


def describe(op: Any, ctx: Any, hw: Any, sizes: Any) -> dict[str, Any] | None:
    """The kernel record of ``op`` under ``ctx`` (None: the step runs no
    kernel for it)."""
    from cost_models.op_classes import op_class, op_features
    from cost_models.op_costs import flops_per_device, op_compute

    cls = op_class(op)
    if cls is None or op.op_type in SKIPPED:
        return None
    flops = flops_per_device(op, ctx, sizes)
    mirrored = op.op_type in MIRRORED and cls != "gather"
    return {
        "type": op.op_type,
        "fn": _fn(op),
        "class": cls,
        "proxy": not mirrored and cls != "view",
        "inputs": [_tensor(ctx, t) for t in op.inputs],
        # An assignment has no output: it writes its variable (input 0).
        "output": _tensor(ctx, op.outputs[0]) if op.outputs else None,
        "flops": flops,
        "features": dict(op_features(op, ctx, sizes, flops)),
        "roofline_s": op_compute(op, ctx, hw, sizes, op.flops())[1],
    }


def _signature(rec: Mapping[str, Any]) -> str:
    keep = {k: rec[k] for k in ("type", "fn", "class", "proxy", "inputs", "output")}
    return json.dumps(keep, sort_keys=True)


def stage_step(plan: Any) -> tuple[Any, list[Any], Any]:
    """``(model, ops, ctx)``: the plan's stage graph for one micro-batch
    (as the search prices it: its config, recomputation and optimizer), the
    ops its step runs, and its layout."""
    from mtf_core.comm import LayoutContext
    from mtf_core.liveness import step_operations
    from mtf_core.models import build_encoder_decoder, build_lm

    builder = build_encoder_decoder if plan.encoder_decoder else build_lm
    model = builder(plan.stage_config, optimizer=plan.optimizer)
    ops = list(step_operations(model.graph, [model.loss]))
    ctx = LayoutContext.make(plan.choice.stage_mesh, plan.stage_plan.layout_rules)
    return model, ops, ctx


def plans(
    keys: Sequence[str], hardware: Any = None, micro_batches: Sequence[int] = ()
) -> Iterable[tuple[str, str, Any]]:
    """``(key, title, plan)`` for each case of ``keys``: the planner's plan
    and the published layout, priced on the case's preset; or, given
    ``hardware`` (a profile), only the plan made on it; or, given
    ``micro_batches``, the plans with each of those counts on the planned
    mesh (the layout and recomputation planned for each)."""
    from bench.scale import CASES
    from cost_models.profiles import get_hardware

    by_key = {c.key: c for c in CASES}
    for key in keys:
        case = by_key[key]
        print(f"{key}: planning {case.title} ...", flush=True)

        if micro_batches:
            c = _plan(case).choice
            for m in micro_batches:
                fixed = _plan(
                    case, stages=[c.stages], tensor=[c.tensor], micro_batches=m
                )
                yield f"{key}/m{m}", case.title, fixed
        elif hardware is not None:
            hw = get_hardware(hardware)
            yield f"{key}/planned-on-{hw.name}", case.title, _plan(case, hw)
        else:
            yield f"{key}/planned", case.title, _plan(case)
            published = case.price_published()
            yield f"{key}/published", case.title, published


def _plan(case: Any, hw: Any = None, **kw: Any) -> Any:
    """``case``'s plan on ``hw`` (default: its preset), with ``kw`` passed on."""
    from layout_planner.choices import plan_transformer

    return plan_transformer(
        case.config,
        case.devices,
        case.hardware if hw is None else hw,
        encoder_decoder=case.encoder_decoder,
        **kw,
    )


def pool_bytes(kernels: Sequence[Mapping[str, Any]], order: Iterable[int]) -> int:
    """Bytes of the buffers torch_kernels.py's replay allocates for ``order``:
    one per distinct (shape, dtype, slot within an op)."""
    pool = set()
    for i in set(order):
        seen: dict[tuple[tuple[int, ...], str], int] = defaultdict(int)
        for t in kernels[i]["inputs"]:
            key = (tuple(t["shape"]), t["dtype"])
            pool.add((*key, seen[key]))
            seen[key] += 1
    return sum(math.prod(s) * dtypes.size_bytes(dt) for s, dt, _ in pool)


def step_kernels(
    ops: Sequence[Any],
    ctx: Any,
    hw: Any,
    kernels: list[dict[str, Any]],
    index: dict[str, int],
) -> list[int]:
    """The kernel numbers of ``ops``' step in order, adding each new
    signature's record to ``kernels`` (``index``: signature to number)."""
    from cost_models.layout_cache import LayoutSizes

    sizes = LayoutSizes(ctx)
    order = []
    for op in ops:
        rec = describe(op, ctx, hw, sizes)
        if rec is None:
            continue
        sig = _signature(rec)
        i = index.get(sig)
        if i is None:
            i = index[sig] = len(kernels)
            kernels.append(rec)
        order.append(i)
    return order


def once_at(model: Any, ops: Sequence[Any]) -> int:
    """How many of the step's kernels (``ops`` less those
    :func:`describe` leaves out) run per micro-batch: the once-per-step
    ones (the optimizer's, from the ``global_step`` update on) follow."""
    from cost_models.op_classes import op_class

    first = next(
        i for i, op in enumerate(model.graph.operations) if op.name == "global_step"
    )
    position = {op: i for i, op in enumerate(model.graph.operations)}
    kept = [op for op in ops if op_class(op) is not None and op.op_type not in SKIPPED]
    n = sum(position[op] < first for op in kept)
    assert all(position[op] >= first for op in kept[n:]), "updates interleave"
    return n


def export(
    keys: Sequence[str],
    path: Path,
    hardware: Any = None,
    micro_batches: Sequence[int] = (),
) -> dict[str, Any]:
    """Plans ``keys``' cases (on ``hardware``, if given; with each of
    ``micro_batches`` on the planned mesh, if given) and writes their stage
    steps' kernels, each priced on the preset, to ``path``."""
    from cost_models.hardware import PRESETS

    preset = PRESETS["h100-nvlink-ib"]
    kernels: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    cases = []
    for key, title, plan in plans(keys, hardware, micro_batches):
        model, ops, ctx = stage_step(plan)
        order = step_kernels(ops, ctx, preset, kernels, index)
        p = plan.pipeline
        cases.append(
            {
                "key": key,
                "title": title,
                "hardware": plan.hardware.name,
                "choice": str(plan.choice),
                "stages": plan.choice.stages,
                "micro_batches": plan.choice.micro_batches,
                "layout_rules": plan.layout_rules,
                "stage_mesh": plan.choice.stage_mesh,
                "step_time_s": plan.step_time_s,
                "per_micro_batch_s": p.per_micro_batch_s,
                "once_s": p.once_s,
                "mfu": plan.mfu,
                "order": order,
                "once_at": once_at(model, ops),
                "pool_bytes": pool_bytes(kernels, order),
            }
        )
        print(
            f"  {key}: {len(order)} kernels in the step, {len(set(order))} "
            f"distinct; roofline "
            f"{sum(kernels[i]['roofline_s'] for i in order) * 1e3:.1f} ms; "
            f"buffer pool {cases[-1]['pool_bytes'] / 2**30:.1f} GiB",
            flush=True,
        )
    out = {"cases": cases, "kernels": kernels}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    print(f"wrote {path} ({len(kernels)} distinct kernels)")
    return out

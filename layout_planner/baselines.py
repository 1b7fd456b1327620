"""The named hand-written layouts every plan is compared with.

* ``replicated``: nothing split.
* ``data-parallel``: the batch dim over one mesh axis (the best one that
  divides it; on a 1-D mesh that is all devices).
* ``megatron``: Megatron-LM style model parallelism: the model dims
  (``heads``, ``d_ff``, ``vocab``, ``experts``, those the graph has and the
  axis divides) over one mesh axis and the batch over another; every pair of
  axes is tried and the best is kept.

"Best" uses the plan's objective, preferring layouts that fit.  Dim names are
Mesh TensorFlow's Transformer names, which the models in ``mtf_core.models``
use.
"""

from __future__ import annotations

from layout_planner.plan import Baseline, PlanCost
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective
from layout_planner.tables import TableCost

BATCH_DIMS = ("batch",)
MODEL_DIMS = ("heads", "d_ff", "vocab", "experts")


def plan_cost(cost: TableCost, capacity_bytes: int) -> PlanCost:
    return PlanCost(
        cost.compute_s, cost.comm_s_by_axis, cost.peak_bytes, capacity_bytes
    )


def baselines(
    problem: LayoutProblem, objective: Objective, capacity_bytes: int
) -> tuple[Baseline, ...]:
    """Replicated, data-parallel and Megatron-style layouts, priced."""
    mesh = problem.mesh_shape
    axes = [i for i, d in enumerate(mesh) if d.size > 1]

    def key(cost: TableCost) -> tuple[float, ...]:
        over = float(cost.peak_bytes > capacity_bytes)
        if objective is Objective.MEMORY:
            return (over, float(cost.peak_bytes), cost.time_s)
        return (over, cost.time_s, float(cost.peak_bytes))

    def best(
        options: list[dict[str, int | None]],
    ) -> tuple[dict[str, int | None], TableCost] | None:
        priced = [(o, problem.table_cost(o)) for o in options]
        valid = [(o, c) for o, c in priced if c.invalid is None]
        if not valid:
            return None
        return min(valid, key=lambda oc: key(oc[1]))

    out = [
        Baseline(
            "replicated",
            problem.rules_for({}),
            plan_cost(problem.table_cost({}), capacity_bytes),
            "nothing split",
        )
    ]
    batch = next((b for b in BATCH_DIMS if b in problem.dim_graph), None)
    if batch is None or not problem.allowed.get(batch):
        why = (
            "the graph has no batch dim"
            if batch is None
            else f"batch cannot be split: {problem.dim_graph.why_whole(batch, mesh)}"
        )
        out.append(Baseline("data-parallel", None, None, why))
    else:
        found = best([{batch: a} for a in problem.allowed[batch]])
        if found is None:
            out.append(Baseline("data-parallel", None, None, "no valid batch split"))
        else:
            asg, cost = found
            out.append(
                Baseline(
                    "data-parallel",
                    problem.rules_for(asg),
                    plan_cost(cost, capacity_bytes),
                    f"{batch} over {problem.rules_for(asg).mesh_dimension_name(batch)}",
                )
            )
    model_dims = [d for d in MODEL_DIMS if d in problem.dim_graph]
    options = []
    for m in axes:
        on_m = [d for d in model_dims if m in problem.allowed.get(d, ())]
        if not on_m:
            continue
        batch_axes: list[int | None] = [None]
        if batch is not None:
            batch_axes += [b for b in problem.allowed.get(batch, ()) if b != m]
        for b in batch_axes:
            option: dict[str, int | None] = {d: m for d in on_m}
            if b is not None and batch is not None:
                option[batch] = b
            options.append(option)
    found = best(options) if options else None
    if found is None:
        why = (
            "the graph has none of the model dims " + ", ".join(MODEL_DIMS)
            if not model_dims
            else "no mesh axis divides the model dims " + ", ".join(model_dims)
        )
        out.append(Baseline("megatron", None, None, why))
    else:
        asg, cost = found
        groups: dict[int, list[str]] = {}
        for d, a in sorted(asg.items()):
            if a is not None:
                groups.setdefault(a, []).append(d)
        note = "; ".join(
            f"{', '.join(ds)} over {mesh[a].name}" for a, ds in sorted(groups.items())
        )
        out.append(
            Baseline(
                "megatron",
                problem.rules_for(asg),
                plan_cost(cost, capacity_bytes),
                note,
            )
        )
    return tuple(out)

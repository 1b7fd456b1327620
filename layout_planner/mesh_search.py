"""Mesh-shape search: which factorization of the devices into axes is best.

Every factorization of ``num_devices`` into at most ``max_dims`` axes of size
> 1 is planned (ordered ones: with a host hierarchy, which axis is inner
changes its link; ``ordered=False`` keeps one order per multiset, sizes
non-increasing, for symmetric meshes).  The best plan wins by: fits in
memory, then the objective (time, or peak then time), then fewer axes, then
larger leading axes (``4x2`` before ``2x4``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cost_models.hardware import HardwareProfile
from layout_planner.analysis import GraphAnalysis
from layout_planner.errors import PlannerError
from layout_planner.plan import LayoutPlan, MeshTrial
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective, SolveParams
from mtf_core.graph import Graph, Tensor
from mtf_core.shapes import Dimension, Shape

AXIS_NAMES = ("x", "y", "z", "w")


def factorizations(
    n: int, max_dims: int, ordered: bool = True
) -> list[tuple[int, ...]]:
    """Tuples of factors > 1 whose product is ``n``, at most ``max_dims`` long
    (``(1,)`` for one device), shortest first, then in decreasing order.

    >>> factorizations(8, 2)
    [(8,), (4, 2), (2, 4)]
    >>> factorizations(8, 3, ordered=False)
    [(8,), (4, 2), (2, 2, 2)]
    """
    if n == 1:
        return [(1,)]
    out: list[tuple[int, ...]] = []

    def extend(rest: int, prefix: tuple[int, ...]) -> None:
        if rest == 1:
            out.append(prefix)
            return
        if len(prefix) == max_dims:
            return
        for f in range(rest, 1, -1):
            if rest % f == 0 and (ordered or not prefix or f <= prefix[-1]):
                extend(rest // f, prefix + (f,))

    extend(n, ())
    return sorted(out, key=lambda t: (len(t), tuple(-f for f in t)))


def search_mesh_shape(
    graph: Graph,
    num_devices: int,
    outputs: Sequence[Tensor],
    hardware: HardwareProfile,
    objective: Objective,
    params: SolveParams,
    max_dims: int = 2,
    verify: bool = True,
    axis_names: Sequence[str] = AXIS_NAMES,
    ordered: bool = True,
) -> LayoutPlan:
    """Plans every mesh shape of ``num_devices`` devices; returns the best plan,
    with every shape tried in ``mesh_trials``."""
    from layout_planner.planner import check_graph, plan_problem

    if (
        isinstance(num_devices, bool)
        or not isinstance(num_devices, int)
        or num_devices < 1
    ):
        raise PlannerError(f"num_devices is {num_devices!r}; expected an integer >= 1")
    if isinstance(max_dims, bool) or not isinstance(max_dims, int) or max_dims < 1:
        raise PlannerError(f"max_mesh_dims is {max_dims!r}; expected an integer >= 1")
    if max_dims > len(axis_names):
        raise PlannerError(
            f"max_mesh_dims is {max_dims}, but only {len(axis_names)} axis names "
            f"were given ({list(axis_names)})"
        )
    check_graph(graph, outputs)
    analysis = GraphAnalysis(graph, outputs)
    trial_params = replace(params, top_k=1)
    best: tuple[tuple[float, ...], LayoutProblem] | None = None
    trials = []
    for sizes in factorizations(num_devices, max_dims, ordered):
        mesh = Shape([Dimension(axis_names[i], s) for i, s in enumerate(sizes)])
        problem = LayoutProblem(graph, mesh, hardware, outputs, analysis)
        plan = plan_problem(
            problem, objective, trial_params, verify=False, extras=False
        )
        value = plan.solver.objective_value
        trials.append(MeshTrial(str(mesh), plan.status, value, str(plan.layout_rules)))
        if not plan.status.has_solution:
            continue
        key = _rank_key(plan, objective, sizes)
        if best is None or key < best[0]:
            best = (key, problem)
    if best is None:
        raise PlannerError(
            f"no mesh shape of {num_devices} devices has a layout: "
            + "; ".join(f"{t.mesh_shape}: {t.status.value}" for t in trials)
        )
    final = plan_problem(best[1], objective, params, verify=verify)
    return replace(final, mesh_trials=tuple(trials))


def _rank_key(
    plan: LayoutPlan, objective: Objective, sizes: tuple[int, ...]
) -> tuple[float, ...]:
    cost = plan.cost
    if objective is Objective.MEMORY:
        primary: tuple[float, ...] = (float(cost.peak_memory_bytes), cost.time_s)
    else:
        primary = (cost.time_s, float(cost.peak_memory_bytes))
    return (
        float(not cost.fits),
        *primary,
        float(len(sizes)),
        *(-float(s) for s in sizes),
    )

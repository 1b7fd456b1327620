"""Mesh-shape search: which factorization of the devices into axes is best.

Every factorization of ``num_devices`` into at most ``max_dims`` axes of size
> 1 is planned (ordered ones: with a host hierarchy, which axis is inner
changes its link; ``ordered=False`` keeps one order per multiset, sizes
non-increasing, for symmetric meshes).  The best plan wins by: fits in
memory, then the objective (time, or peak then time), then fewer axes, then
larger leading axes (``4x2`` before ``2x4``).

The request's ``time_limit_s`` bounds the whole search: each shape's solve gets
what is left of it, and when it runs out the search stops and returns the
best shape tried so far, with status ``feasible`` and a ``reason`` that says
how many of the shapes it tried.  (It may overrun by one shape's tables and
the final plan's assembly.)
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from cost_models.hardware import HardwareProfile
from layout_planner.analysis import GraphAnalysis
from layout_planner.errors import PlannerError
from layout_planner.plan import LayoutPlan, MeshTrial, mesh_text
from layout_planner.plan_mesh import check_graph, plan_problem
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective, SolveParams, SolveStatus
from mtf_core.graph import Graph, Tensor
from mtf_core.shapes import Dimension, Shape

AXIS_NAMES = ("x", "y", "z", "w")
#: The most devices a search factorizes (as the planner service allows): the
#: enumeration of mesh shapes takes time linear in the count.
MAX_DEVICES = 2**20
# The least solver time a shape (or the final plan) gets once the request's
# budget is spent (the final plan must still be made).
_MIN_SOLVE_S = 0.05


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
    progress: Callable[[str, float], None] | None = None,
) -> LayoutPlan:
    """Plans every mesh shape of ``num_devices`` devices (within
    ``params.time_limit_s`` for the whole search); returns the best plan, with
    every shape tried in ``mesh_trials``.  ``progress(phase, fraction)`` is
    called before each shape and before the final plan."""
    t0 = time.monotonic()
    deadline = t0 + params.time_limit_s
    if (
        isinstance(num_devices, bool)
        or not isinstance(num_devices, numbers.Integral)
        or not 1 <= num_devices <= MAX_DEVICES
    ):
        raise PlannerError(
            f"num_devices is {num_devices!r}; expected an integer >= 1 and <= "
            f"{MAX_DEVICES}"
        )
    num_devices = int(num_devices)  # a numpy integer too
    if isinstance(max_dims, bool) or not isinstance(max_dims, int) or max_dims < 1:
        raise PlannerError(f"max_mesh_dims is {max_dims!r}; expected an integer >= 1")
    if max_dims > len(axis_names):
        raise PlannerError(
            f"max_mesh_dims is {max_dims}, but only {len(axis_names)} axis names "
            f"were given ({list(axis_names)})"
        )
    check_graph(graph, outputs)
    analysis = GraphAnalysis(graph, outputs)
    shapes = factorizations(num_devices, max_dims, ordered)
    best: tuple[tuple[float, ...], LayoutProblem] | None = None
    trials: list[MeshTrial] = []
    for i, sizes in enumerate(shapes):
        left = deadline - time.monotonic()
        if trials and left <= 0:
            break
        mesh = Shape([Dimension(axis_names[k], s) for k, s in enumerate(sizes)])
        if progress is not None:
            progress(
                f"mesh shape {i + 1} of {len(shapes)}: {mesh_text(mesh)}",
                i / len(shapes),
            )
        problem = LayoutProblem(graph, mesh, hardware, outputs, analysis)
        trial_params = replace(params, top_k=1, time_limit_s=max(left, _MIN_SOLVE_S))
        plan = plan_problem(
            problem, objective, trial_params, verify=False, extras=False
        )
        value = plan.solver.objective_value
        trials.append(
            MeshTrial(mesh_text(mesh), plan.status, value, str(plan.layout_rules))
        )
        if not plan.status.has_solution:
            continue
        key = _rank_key(plan, objective, sizes)
        if best is None or key < best[0]:
            best = (key, problem)
    stopped = len(trials) < len(shapes)
    if best is None:
        tried = "; ".join(f"{t.mesh_shape}: {t.status.value}" for t in trials)
        if stopped:
            raise PlannerError(
                f"no layout found within time_limit_s={params.time_limit_s:g} s: the "
                f"mesh-shape search tried {len(trials)} of the {len(shapes)} shapes "
                f"of {num_devices} devices ({tried}); raise time_limit_s or lower "
                "max_mesh_dims"
            )
        raise PlannerError(
            f"no mesh shape of {num_devices} devices has a layout: {tried}"
        )
    if progress is not None:
        progress(
            f"planning on {mesh_text(best[1].mesh_shape)}", len(trials) / len(shapes)
        )
    left = deadline - time.monotonic()
    final = plan_problem(
        best[1],
        objective,
        replace(params, time_limit_s=max(left, _MIN_SOLVE_S)),
        verify=verify,
    )
    final = replace(final, mesh_trials=tuple(trials))
    if stopped:
        note = (
            f"the mesh-shape search stopped at time_limit_s={params.time_limit_s:g} s "
            f"after {len(trials)} of the {len(shapes)} shapes of {num_devices} "
            f"devices; this is the best of those, not proven best of all (raise "
            "time_limit_s, or lower max_mesh_dims, to try them all)"
        )
        status = SolveStatus.FEASIBLE if final.status.has_solution else final.status
        reason = f"{final.reason}; {note}" if final.reason else note
        final = replace(final, status=status, reason=reason)
    return final


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

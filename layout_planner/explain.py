"""Why each dimension went where it did.

For every dim name: if no layout can split it, the static reason (an op needs
it whole, or no mesh axis divides it).  Otherwise every other choice for that
dim alone (not split, or each other allowed axis) is priced from the
problem's tables, and the reason names what that change would cost: more step
time, more memory than fits, or a layout the lowering rejects (and why).
"""

from __future__ import annotations

from layout_planner.plan import Alternative, DimChoice, fmt_bytes, fmt_s
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective
from layout_planner.tables import TableCost
from mtf_core.shapes import Shape


def explain_dims(
    problem: LayoutProblem,
    assignment: dict[str, int | None],
    objective: Objective,
    capacity_bytes: int,
) -> tuple[DimChoice, ...]:
    """One :class:`DimChoice` per dim name of the graph, in name order."""
    mesh = problem.mesh_shape
    base = problem.table_cost(assignment)
    out = []
    for name in problem.dim_graph.names:
        info = problem.dim_graph.info(name)
        chosen = assignment.get(name)
        axis_name = None if chosen is None else mesh[chosen].name
        whole = problem.dim_graph.why_whole(name, mesh)
        if whole is not None:
            out.append(DimChoice(name, info.sizes, None, f"kept whole: {whole}"))
            continue
        alts = []
        for option in (None, *problem.allowed[name]):
            if option == chosen:
                continue
            cost = problem.table_cost({**assignment, name: option})
            alts.append((option, cost))
        reason = _reason(mesh, name, chosen, base, alts, objective, capacity_bytes)
        out.append(
            DimChoice(
                name,
                info.sizes,
                axis_name,
                reason,
                tuple(
                    Alternative(
                        None if o is None else mesh[o].name,
                        None if c.invalid else c.time_s,
                        None if c.invalid else c.peak_bytes,
                        c.invalid,
                    )
                    for o, c in alts
                ),
            )
        )
    return tuple(out)


def _reason(
    mesh: Shape,
    name: str,
    chosen: int | None,
    base: TableCost,
    alts: list[tuple[int | None, TableCost]],
    objective: Objective,
    capacity_bytes: int,
) -> str:
    head = (
        "kept whole"
        if chosen is None
        else f"split over {mesh[chosen].name} ({mesh[chosen].size} ways)"
    )
    parts = []
    for option, cost in alts:
        what = (
            "keeping it whole"
            if option is None
            else f"splitting it over {mesh[option].name}"
        )
        parts.append(f"{what} {_consequence(base, cost, objective, capacity_bytes)}")
    if not parts:
        return head
    return f"{head}: " + "; ".join(parts)


def _consequence(
    base: TableCost, alt: TableCost, objective: Objective, capacity_bytes: int
) -> str:
    if alt.invalid:
        return f"is not possible ({alt.invalid})"
    dt = alt.time_s - base.time_s
    dm = alt.peak_bytes - base.peak_bytes
    time_txt = (
        f"{'+' if dt >= 0 else '-'}{fmt_s(abs(dt))} step time"
        if abs(dt) > 1e-15
        else "the same step time"
    )
    mem_txt = (
        f"{'+' if dm >= 0 else '-'}{fmt_bytes(abs(dm))} peak memory"
        if dm
        else "the same peak memory"
    )
    if alt.peak_bytes > capacity_bytes and base.peak_bytes <= capacity_bytes:
        return (
            f"would not fit ({fmt_bytes(alt.peak_bytes)} per device > "
            f"{fmt_bytes(capacity_bytes)}); {time_txt}"
        )
    if objective is Objective.MEMORY:
        return f"gives {mem_txt}, {time_txt}"
    return f"gives {time_txt}, {mem_txt}"

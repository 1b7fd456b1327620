"""``auto_layout``: plan the layout of a graph on a mesh.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> x = mtf.zeros(m, "a:10,b:5"); y = mtf.zeros(m, "b:5,c:20")
>>> z = mtf.einsum([x, y], "a:10,c:20")
>>> plan = mtf.auto_layout(g, "m1:4,m2:2", outputs=[z], objective="memory")
>>> str(plan.layout_rules), plan.status.value
('a:m2;c:m1', 'optimal')
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cost_models.hardware import HardwareProfile
from layout_planner.errors import PlannerError
from layout_planner.mesh_search import search_mesh_shape
from layout_planner.options import (
    DEFAULT_TIME_LIMIT_S,
    MeshTarget,
    PlanOptions,
    resolve_options,
)
from layout_planner.plan import LayoutPlan
from layout_planner.plan_mesh import check_graph, check_mesh_shape, plan_problem
from layout_planner.problem import LayoutProblem
from layout_planner.program import Objective
from mtf_core.graph import Graph, Tensor

#: A progress callback: ``progress(phase, fraction done)``.
Progress = Callable[[str, float], None]


def auto_layout(
    graph: Graph,
    mesh_shape: MeshTarget,
    outputs: Sequence[Tensor] = (),
    hardware: str | HardwareProfile | Mapping[str, Any] = "cpu-host",
    objective: str | Objective = "time",
    memory_limit: int | None = None,
    top_k: int = 5,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    num_workers: int | None = None,
    seed: int = 0,
    verify: bool = True,
    max_mesh_dims: int = 2,
    options: PlanOptions | None = None,
    progress: Progress | None = None,
) -> LayoutPlan:
    """The best layout rules for ``graph`` on ``mesh_shape``.

    Args:
      graph: the mtf graph (a training step: loss, gradients, updates).
      mesh_shape: ``"x:2;y:4"`` (or a Shape), or an int: a device count, and
        the mesh shape is searched too (up to ``max_mesh_dims`` axes named
        x, y, z, w; see :func:`layout_planner.mesh_search.search_mesh_shape`).
      outputs: tensors exported after the step (they stay alive to the end).
      hardware: a preset name (``cost_models.PRESETS``), profile or dict.
      objective: ``"time"`` (compute + communication under the memory
        capacity) or ``"memory"`` (peak bytes per device, then time).
      memory_limit: per-device bytes; overrides the hardware's capacity.
      top_k: how many distinct layouts to rank (the plan is rank 1).
      time_limit_s: wall-clock budget for the whole request, the mesh-shape
        search included (which then returns the best shape it tried, status
        ``feasible``, and says how many it tried).
      num_workers: CP-SAT workers (default: one for a small program, where a
        single search proves the optimum in milliseconds, else this machine's
        cores, at most 8; see ``layout_planner.program.workers_for``).
        The answer does not depend on it when the solve is proven optimal.
      seed: CP-SAT's random seed.
      verify: price the plan again with ``cost_models.evaluate`` and raise
        :class:`PlanVerificationError` if the two disagree.
      options: all of the above as one
        :class:`~layout_planner.options.PlanOptions` (then leave the separate
        keyword arguments at their defaults).
      progress: called as ``progress(phase, fraction)`` while the mesh-shape
        search goes from shape to shape (a service shows it on its jobs).

    ``mtf.auto_layout`` is this function with one more keyword, ``server``:
    a planner service's URL to plan on instead (:func:`api.client.auto_layout`;
    the planner itself knows nothing of HTTP).

    Ties between layouts of equal objective go to the lexicographically
    smallest choice vector: dims in name order, each "not split" < first mesh
    axis < second axis ...  So the same request gives the same plan.

    >>> # plan = mtf.auto_layout(graph, "batch:4;model:2", hardware="h100-nvlink-ib")
    >>> # print(plan.layout_rules); print(plan.explain())
    """
    options = resolve_options(
        hardware,
        objective,
        memory_limit,
        top_k,
        time_limit_s,
        num_workers,
        seed,
        verify,
        max_mesh_dims,
        options,
    )
    if progress is not None and not callable(progress):
        raise PlannerError(f"progress is {progress!r}; expected a callable or None")
    params = options.solve_params()
    hw = options.hardware_with_limit
    if isinstance(mesh_shape, numbers.Integral) and not isinstance(mesh_shape, bool):
        return search_mesh_shape(
            graph,
            mesh_shape,
            outputs=outputs,
            hardware=hw,
            objective=options.objective,
            params=params,
            max_dims=options.max_mesh_dims,
            verify=options.verify,
            progress=progress,
        )
    mesh = check_mesh_shape(mesh_shape)
    return plan_problem(
        LayoutProblem(check_graph(graph, outputs), mesh, hw, outputs),
        options.objective,
        params,
        verify=options.verify,
    )

"""Mesh TensorFlow's ``mtf.auto_mtf`` API, on the new planner.

Like the original, both functions minimise peak memory per device (the
``memory`` objective); ties go to the faster layout, then to the canonical
rule order (see :func:`layout_planner.planner.auto_layout`), so the answer is
the same on every run.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "my_mesh")
>>> x = mtf.zeros(m, "a:10,b:5"); y = mtf.zeros(m, "b:5,c:20")
>>> z = mtf.einsum([x, y], "a:10,c:20")
>>> str(mtf.auto_mtf.layout(g, "m1:4,m2:2", [z]))
'a:m2;c:m1'
>>> rules, mesh = mtf.auto_mtf.layout_and_mesh_shape(g, 8, [z])
>>> str(mesh), str(rules)
('mesh_0:4,mesh_1:2', 'a:mesh_1;c:mesh_0')
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from layout_planner.errors import PlannerError
from layout_planner.mesh_search import search_mesh_shape
from layout_planner.options import PlanOptions
from layout_planner.planner import auto_layout
from layout_planner.program import Objective
from mtf_core.graph import Graph, Tensor
from mtf_core.layout import LayoutRules
from mtf_core.liveness import output_list
from mtf_core.shapes import Shape, ShapeLike

# The memory objective needs no hardware (time only breaks ties), and Mesh
# TensorFlow's API returns one layout, unverified.
_OPTIONS = PlanOptions(objective=Objective.MEMORY, top_k=1, verify=False)


def layout(
    mtf_graph: Graph, mesh_shape: ShapeLike, mtf_outputs: Sequence[Tensor] = ()
) -> LayoutRules:
    """Layout rules minimising peak memory of ``mtf_graph`` on ``mesh_shape``."""
    outputs = output_list(mtf_outputs, name="mtf_outputs", error=PlannerError)
    plan = auto_layout(mtf_graph, mesh_shape, outputs, options=_OPTIONS)
    return plan.layout_rules


def layout_and_mesh_shape(
    mtf_graph: Graph,
    num_machines: int,
    mtf_outputs: Sequence[Tensor] = (),
    max_mesh_shape_dimensions: int = 2,
) -> tuple[LayoutRules, Shape]:
    """The mesh shape (axes ``mesh_0``, ``mesh_1``, ..., sizes non-increasing)
    and layout rules with the least peak memory on ``num_machines`` devices."""
    dims = max_mesh_shape_dimensions
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise PlannerError(
            f"max_mesh_shape_dimensions is {dims!r}; expected an integer >= 1"
        )
    plan = search_mesh_shape(
        mtf_graph,
        num_machines,
        outputs=output_list(mtf_outputs, name="mtf_outputs", error=PlannerError),
        hardware=_OPTIONS.hardware,
        objective=_OPTIONS.objective,
        params=_OPTIONS.solve_params(),
        max_dims=max_mesh_shape_dimensions,
        verify=_OPTIONS.verify,
        axis_names=tuple(f"mesh_{i}" for i in range(max(max_mesh_shape_dimensions, 1))),
        ordered=False,
    )
    return plan.layout_rules, plan.mesh_shape


def __getattr__(name: str) -> ModuleType:
    # ``mesh_tensorflow.auto_mtf.layout_optimizer``, Mesh TF's memory-only
    # CP-SAT model: mtf_core.compat reaches it through ``mtf.auto_mtf`` (the
    # extensions seam), loaded on first use.
    if name == "layout_optimizer":
        from layout_planner import mesh_tf_layout_optimizer

        return mesh_tf_layout_optimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

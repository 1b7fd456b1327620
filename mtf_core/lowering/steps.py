"""``compile_function``: a training (or inference) step, compiled for the
backend its mesh implementation uses: :class:`~compiled.CompiledFunction`
(placement) or :class:`~spmd_compiled.SpmdCompiledFunction` (SPMD).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from mtf_core.errors import GraphTypeError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.lowering.compiled import CompiledFunction
from mtf_core.lowering.mesh_impl import MeshImpl
from mtf_core.lowering.spmd_compiled import SpmdCompiledFunction
from mtf_core.lowering.step_common import CompiledStep
from mtf_core.lowering.variables import VariableStore


def compile_function(
    graph: Graph,
    mesh_to_impl: Mapping[Mesh, MeshImpl],
    inputs: Sequence[Tensor] = (),
    outputs: Sequence[Tensor] = (),
    updates: Sequence[Operation] = (),
    variables: VariableStore | None = None,
    graph_optimization: bool | None = None,
) -> CompiledStep:
    """Compiles a training (or inference) step: a :class:`CompiledFunction`
    (placement backend) or :class:`SpmdCompiledFunction` (SPMD).

    ``graph_optimization``: run TensorFlow's graph optimizer on the step
    (default: only when some device is not a CPU; on CPU meshes it makes the
    first call much slower and the others no faster).

    Raises GraphTypeError naming the first argument that is not what it
    should be (a tensor or an op of another graph, a mesh without its
    implementation's type)."""
    _check_step(graph, mesh_to_impl, inputs, outputs, updates)
    if any(getattr(impl, "is_spmd", False) for impl in mesh_to_impl.values()):
        # The SPMD backend traces one per-device program and launches it per device.
        return SpmdCompiledFunction(
            graph, mesh_to_impl, inputs, outputs, updates, variables
        )
    return CompiledFunction(
        graph,
        mesh_to_impl,
        inputs,
        outputs,
        updates,
        variables,
        graph_optimization=graph_optimization,
    )


def _check_step(
    graph: object,
    mesh_to_impl: object,
    inputs: object,
    outputs: object,
    updates: object,
) -> None:
    if not isinstance(graph, Graph):
        raise GraphTypeError(f"graph {graph!r} is not an mtf.Graph")
    if not isinstance(mesh_to_impl, Mapping) or not mesh_to_impl:
        raise GraphTypeError(
            f"mesh_to_impl {mesh_to_impl!r}: expected a dict from each mtf.Mesh "
            "to its mesh implementation (e.g. PlacementMeshImpl)"
        )
    for mesh, impl in mesh_to_impl.items():
        if not isinstance(mesh, Mesh) or mesh.graph is not graph:
            raise GraphTypeError(
                f"mesh_to_impl key {mesh!r} is not an mtf.Mesh of this graph"
            )
        if not isinstance(impl, MeshImpl):
            raise GraphTypeError(
                f"mesh_to_impl[{mesh.name!r}] is {impl!r}; expected a mesh "
                "implementation (PlacementMeshImpl or SimdMeshImpl)"
            )
    for what, items, kind in (
        ("inputs", inputs, Tensor),
        ("outputs", outputs, Tensor),
        ("updates", updates, Operation),
    ):
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise GraphTypeError(f"{what} {items!r}: expected a list")
        for i, x in enumerate(items):
            if not isinstance(x, kind) or x.graph is not graph:
                raise GraphTypeError(
                    f"{what}[{i}] is {x!r}; expected an mtf.{kind.__name__} of "
                    "this graph"
                )


if TYPE_CHECKING:
    # mypy checks that the lowering and both backends satisfy the seams ops
    # are typed against (mtf_core/seams.py).
    from mtf_core.lowering.lowering import Lowering
    from mtf_core.lowering.placement import PlacementMeshImpl
    from mtf_core.lowering.spmd import SimdMeshImpl
    from mtf_core.seams import LoweringContext, MeshBackend

    def _lowering_is_a_context(x: Lowering) -> LoweringContext:
        return x

    def _impls_are_backends(
        p: PlacementMeshImpl, s: SimdMeshImpl, m: MeshImpl
    ) -> tuple[MeshBackend, MeshBackend, MeshBackend]:
        return p, s, m

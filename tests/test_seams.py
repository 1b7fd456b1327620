"""The typed seams ops are written against (mtf_core/seams.py): the real
lowering and both backends satisfy them; mypy checks the same statically
(mtf_core/lowering/steps.py)."""

from __future__ import annotations

import pytest

import mtf_core as mtf
from mtf_core.seams import LoweringContext, MeshBackend

pytestmark = pytest.mark.tf


def test_the_lowering_and_both_backends_satisfy_the_seams(devices) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    y = mtf.reduce_sum(mtf.ones(mesh, "a:4,b:2"), output_shape="a:4")
    impl = mtf.PlacementMeshImpl("x:2", "a:x", devices[:2])
    lowering = mtf.Lowering(graph, {mesh: impl})
    assert isinstance(lowering, LoweringContext)
    assert isinstance(lowering.mesh_impl(y.operation), MeshBackend)
    assert isinstance(mtf.SimdMeshImpl("x:2", "a:x", devices[:2]), MeshBackend)


def test_something_missing_a_primitive_is_not_a_backend() -> None:
    class HalfBackend:
        ctx = shape = current_op = None

        def slicewise(self, fn, *inputs):  # noqa: ANN001
            return None

    assert not isinstance(HalfBackend(), MeshBackend)


def test_a_backend_missing_a_primitive_cannot_be_made() -> None:
    from mtf_core.lowering.mesh_impl import MeshImpl

    class Partial(MeshImpl):
        def slicewise(self, fn, *inputs):  # noqa: ANN001
            return None

    with pytest.raises(TypeError, match=r"abstract.*allreduce"):
        Partial("x:2", "")

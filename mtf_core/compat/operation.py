"""``mtf.Operation`` as Mesh TF programs subclass it, and
``mtf.ImportLaidOutTensorOperation``.

Mesh TF's ops state their splittability as two frozensets,
``self._splittable_dims, self._unsplittable_dims``, which they make with
``self._initialize_splittable_and_unsplittable_dims(default, exceptions)``.
:class:`Operation` here is mtf_core's operation with those helpers, the two
attributes written through to mtf_core's ``_unsplittable`` (so the planner
and the lowering see what the op declared), and ``isinstance(op,
mtf.Operation)`` true of every mtf_core operation, as every Mesh TF op is an
``mtf.Operation``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mtf_core import graph
from mtf_core.errors import ArgumentError, LoweringError, SerializationError
from mtf_core.graph import Mesh, Tensor
from mtf_core.seams import LoweringContext
from mtf_core.serialization.registry import OpSpec, register
from mtf_core.shapes import convert_to_shape


class _AnyOperationMeta(graph.OperationMeta):
    """``isinstance(x, mtf.Operation)`` holds for every mtf_core op; for a
    subclass of it, as usual."""

    def __instancecheck__(cls, instance: object) -> bool:
        if cls is Operation:
            return isinstance(instance, graph.Operation)
        return super().__instancecheck__(instance)

    def __subclasscheck__(cls, subclass: type) -> bool:
        if cls is Operation:
            return issubclass(subclass, graph.Operation)
        return super().__subclasscheck__(subclass)


class Operation(graph.Operation, metaclass=_AnyOperationMeta):
    """mtf_core's :class:`~mtf_core.graph.Operation` with Mesh TF's
    splittability helpers.  As in Mesh TF, every dim starts splittable."""

    def __init__(
        self,
        inputs: Sequence[Tensor],
        mesh: Mesh | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(inputs, mesh, name)

    def _initialize_splittable_and_unsplittable_dims(
        self,
        default_splittability: str,
        exception_dims_iterable: Iterable[str] | None = None,
    ) -> tuple[frozenset[str], frozenset[str]]:
        """``(splittable, unsplittable)`` dim names of this op's inputs and
        outputs: each dim is ``default_splittability`` ("splittable" or
        "unsplittable") unless named in ``exception_dims_iterable``."""
        exceptions = frozenset(exception_dims_iterable or ())
        default = frozenset(self.all_dim_names - exceptions)
        if default_splittability == "splittable":
            return default, exceptions
        if default_splittability == "unsplittable":
            return exceptions, default
        raise ArgumentError(
            f"{type(self).__name__} {self.name}: default_splittability "
            f"{default_splittability!r}; expected 'splittable' or 'unsplittable'"
        )

    def _initialize_all_dimensions_as_splittable(
        self,
    ) -> tuple[frozenset[str], frozenset[str]]:
        return self._initialize_splittable_and_unsplittable_dims("splittable")

    # Mesh TF's ops assign these two; mtf_core keeps the unsplittable ones.
    @property
    def _splittable_dims(self) -> frozenset[str]:
        return frozenset(self.splittable_dims)

    @_splittable_dims.setter
    def _splittable_dims(self, names: Iterable[str]) -> None:
        self._unsplittable = frozenset(self.all_dim_names - frozenset(names))

    @property
    def _unsplittable_dims(self) -> frozenset[str]:
        return frozenset(self._unsplittable)

    @_unsplittable_dims.setter
    def _unsplittable_dims(self, names: Iterable[str]) -> None:
        self._unsplittable = frozenset(names)


class ImportLaidOutTensorOperation(Operation):
    """An mtf tensor whose per-device slices are given already laid out
    (Mesh TF's ``import_laid_out_tensor``, for input pipelines that feed each
    device its own slice).

    ``laid_out_tensor`` is a backend's laid-out value, or an object with a
    ``tensor_list`` (Mesh TF's ``LaidOutTensor``): one ``tf.Tensor`` per
    processor in pnum order, or, on the SPMD backend inside a replica
    program, this replica's one slice.  The slices belong to one layout, so
    no dim can be re-split: every dim is unsplittable (the planner must
    replicate them or be told the layout), and lowering checks each slice's
    shape against the layout's.
    """

    op_type = "ImportLaidOutTensor"

    def __init__(
        self, mesh: Mesh, laid_out_tensor: Any, shape: Any, name: str | None = None
    ) -> None:
        super().__init__([], mesh=mesh, name=name or "import")
        slices = _slices_of(laid_out_tensor)
        if slices is not None and not slices:
            raise ArgumentError(
                f"ImportLaidOutTensorOperation {self.name}: the laid-out tensor "
                "has no slices"
            )
        dtype = (slices[0] if slices else laid_out_tensor).dtype
        self.laid_out_tensor = laid_out_tensor
        self._add_output(convert_to_shape(shape), dtype)
        self._splittable_dims, self._unsplittable_dims = (
            self._initialize_splittable_and_unsplittable_dims("unsplittable")
        )

    @property
    def has_gradient(self) -> bool:
        return False

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return []

    def lower(self, lowering: LoweringContext) -> None:
        out = self.outputs[0]
        impl = lowering.mesh_impl(self)
        value = _backend_value(self.laid_out_tensor, impl, self.name)
        want = impl.slice_shape(out.shape)
        for s in _slices_of(value) or []:
            if (
                s is not None
                and s.shape.is_fully_defined()
                and s.shape.as_list() != want
            ):
                raise LoweringError(
                    f"{self.name}: a slice has shape {s.shape.as_list()}, but "
                    f"[{out.shape}] under layout {impl.tensor_layout(out.shape)} "
                    f"has slices of {want}"
                )
        lowering.set_tensor_lowering(out, value)


def _slices_of(value: Any) -> list[Any] | None:
    """The per-device tensors of a laid-out value, or None for one tensor."""
    for attr in ("tensor_list", "slices"):
        if hasattr(value, attr):
            return list(getattr(value, attr))
    if isinstance(value, (list, tuple)):
        return list(value)
    if hasattr(value, "tensor"):  # one replica's slice
        return [value.tensor]
    return None


def _backend_value(value: Any, impl: Any, what: str) -> Any:
    """``value`` as ``impl``'s laid-out form."""
    from mtf_core.lowering.placement import LaidOutTensor, PlacementMeshImpl
    from mtf_core.lowering.spmd_values import LocalSlices, ReplicaTensor

    if isinstance(value, (LaidOutTensor, LocalSlices, ReplicaTensor)):
        return value
    slices = _slices_of(value)
    if slices is None:
        raise ArgumentError(
            f"{what}: {value!r} is not a laid-out tensor (expected a backend's "
            "laid-out value, a list of tf.Tensors or an object with tensor_list)"
        )
    if len(slices) == impl.size:
        if isinstance(impl, PlacementMeshImpl):
            return LaidOutTensor(slices)
        return LocalSlices(slices)
    if len(slices) == 1 and not isinstance(impl, PlacementMeshImpl):
        return ReplicaTensor(slices[0])
    raise ArgumentError(
        f"{what}: {len(slices)} slices for a mesh of {impl.size} processors "
        f"({impl.shape}); expected one per processor"
    )


def import_laid_out_tensor(
    mesh: Mesh, laid_out_tensor: Any, shape: Any, name: str | None = None
) -> Tensor:
    """Mesh TF's ``mtf.import_laid_out_tensor``: see
    :class:`ImportLaidOutTensorOperation`."""
    return ImportLaidOutTensorOperation(
        mesh, laid_out_tensor, shape, name=name
    ).outputs[0]


__all__ = [
    "ImportLaidOutTensorOperation",
    "Operation",
    "import_laid_out_tensor",
]


@register(ImportLaidOutTensorOperation)
def _import_laid_out_from_document(spec: OpSpec) -> Operation:
    raise SerializationError(
        f"{spec.path}: ImportLaidOutTensor {spec.name!r} cannot be rebuilt from a "
        "document: it holds TensorFlow values already laid out on devices; "
        "build it in Python"
    )

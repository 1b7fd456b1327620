"""The builder registry: ``op_type`` -> a function that rebuilds that operation.

A builder gets an :class:`OpSpec` (mesh, input tensors, attrs, name and the
declared outputs) and returns the real operation, built with its class's
constructor so that shapes, splittability, flops and ``communication(ctx)`` are
the op's own.  Op families register one builder per class::

    @register(Einsum)
    def _einsum(spec: OpSpec) -> Operation:
        return Einsum(spec.inputs, spec.output_shape(0), name=spec.name)

A builder must create exactly one operation (the reader checks it) and should
take sizes from the inputs wherever the op can compute them, using the declared
outputs only for what the op cannot know (an einsum's output dims, a
placeholder's shape): the reader then compares what the op computes with what
the document declares.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtf_core.errors import MtfError, SerializationError
from mtf_core.graph import Mesh, Operation, Tensor
from mtf_core.serialization import schema
from mtf_core.shapes import Dimension, Shape


@dataclass(frozen=True)
class TensorSpec:
    """A declared output: its shape and dtype name."""

    shape: Shape
    dtype: str


class Attrs:
    """An op's ``attrs`` object with typed getters whose errors name the field."""

    def __init__(
        self,
        values: Mapping[str, Any],
        path: str,
        limits: schema.Limits = schema.DEFAULT_LIMITS,
    ) -> None:
        self._values = dict(values)
        self.path = path
        self.limits = limits

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def raw(self, key: str, default: Any = None) -> Any:
        """The value as the document has it (unchecked), or ``default``."""
        return self._values.get(key, default)

    def _get(self, key: str, default: Any) -> Any:
        if key in self._values:
            return self._values[key]
        if default is _REQUIRED:
            raise SerializationError(f"{self.path}: missing required attr {key!r}")
        return default

    def get_str(self, key: str, default: str | None = None) -> str:
        value = self._get(key, _REQUIRED if default is None else default)
        return schema.expect_str(value, f"{self.path}.{key}")

    def get_choice(
        self, key: str, choices: Collection[str], default: str | None = None
    ) -> str:
        value = self.get_str(key, default)
        if value not in choices:
            raise SerializationError(
                f"{self.path}.{key}: {value!r} is not one of {sorted(choices)}"
            )
        return value

    def get_bool(self, key: str, default: bool | None = None) -> bool:
        value = self._get(key, _REQUIRED if default is None else default)
        return schema.expect_bool(value, f"{self.path}.{key}")

    def get_int(self, key: str, default: int | None = None) -> int:
        value = self._get(key, _REQUIRED if default is None else default)
        return schema.expect_int(value, f"{self.path}.{key}")

    def get_number(self, key: str, default: float | None = None) -> float:
        value = self._get(key, _REQUIRED if default is None else default)
        return schema.expect_number(value, f"{self.path}.{key}")

    def get_int_list(self, key: str, minimum: int | None = None) -> list[int]:
        path = f"{self.path}.{key}"
        values = schema.expect_list(self._get(key, _REQUIRED), path)
        out = [schema.expect_int(v, f"{path}[{i}]") for i, v in enumerate(values)]
        for i, v in enumerate(out):
            if minimum is not None and v < minimum:
                raise SerializationError(
                    f"{path}[{i}]: {v} is less than the minimum {minimum}"
                )
        return out

    def get_dim(self, key: str) -> Dimension:
        """A dimension written as ``"name:size"`` (how ops' attrs() spell them)."""
        path = f"{self.path}.{key}"
        text = schema.expect_str(self._get(key, _REQUIRED), path)
        name, sep, size = text.partition(":")
        if not sep or not (size.strip().isascii() and size.strip().isdigit()):
            raise SerializationError(
                f"{path}: {text!r} is not a dimension; expected 'name:size', e.g. "
                "'vocab:32000'"
            )
        try:
            dim = Dimension(name.strip(), int(size))
        except MtfError as e:
            raise SerializationError(f"{path}: {e}") from None
        schema.check_limit(self.limits, "max_dim_size", dim.size, path, "size")
        return dim


_REQUIRED = object()


@dataclass
class OpSpec:
    """What a builder gets: the op as the document describes it."""

    op_type: str
    name: str
    mesh: Mesh
    inputs: list[Tensor]
    attrs: Attrs
    outputs: list[TensorSpec]
    path: str
    limits: schema.Limits

    def output_shape(self, i: int = 0) -> Shape:
        return self._output(i).shape

    def output_dtype(self, i: int = 0) -> str:
        return self._output(i).dtype

    def _output(self, i: int) -> TensorSpec:
        if i >= len(self.outputs):
            raise SerializationError(
                f"{self.path}.outputs: {self.op_type} has {i + 1} or more outputs but "
                f"{len(self.outputs)} are declared"
            )
        return self.outputs[i]

    def expect_inputs(self, n: int | Sequence[int]) -> None:
        allowed = [n] if isinstance(n, int) else list(n)
        if len(self.inputs) not in allowed:
            want = " or ".join(map(str, allowed))
            raise SerializationError(
                f"{self.path}.inputs: {self.op_type} takes {want} input(s), got "
                f"{len(self.inputs)}"
            )

    def expect_min_inputs(self, n: int) -> None:
        if len(self.inputs) < n:
            raise SerializationError(
                f"{self.path}.inputs: {self.op_type} takes at least {n} input(s), got "
                f"{len(self.inputs)}"
            )

    def input_dim(
        self, key: str, dim: Dimension | str | None = None, i: int = 0
    ) -> Dimension:
        """The dimension of input ``i`` that attr ``key`` names.

        ``dim`` is the attr's value when the builder has read it already (a
        Dimension must then match in size); by default the attr is read as a
        dimension name.
        """
        if dim is None:
            dim = self.attrs.get_str(key)
        x = self.inputs[i]
        path = f"{self.attrs.path}.{key}"
        name = dim if isinstance(dim, str) else dim.name
        if name not in x.shape.dimension_names:
            raise SerializationError(
                f"{path}: {x.name} [{x.shape}] has no dimension {name!r}; expected "
                f"one of {x.shape.dimension_names}"
            )
        found = x.shape.get_dim_by_name(name)
        if isinstance(dim, Dimension) and dim != found:
            raise SerializationError(
                f"{path}: {dim} does not match {found} of {x.name} [{x.shape}]"
            )
        return found

    def ordered_like_output(self, computed: Shape, i: int = 0) -> Shape:
        """``computed``'s dims (sizes included) in the declared output's order,
        when both have the same dim names; otherwise the declared shape (and the
        op's own checks or the reader's comparison reject it)."""
        declared = self.output_shape(i)
        if sorted(declared.dimension_names) != sorted(computed.dimension_names):
            return declared
        return Shape([computed.get_dim_by_name(n) for n in declared.dimension_names])


Builder = Callable[[OpSpec], Operation]


@dataclass(frozen=True)
class Registration:
    op_class: type[Operation]
    builder: Builder


_BUILDERS: dict[str, Registration] = {}


def register(op_class: type[Operation]) -> Callable[[Builder], Builder]:
    """Registers the decorated function as the builder of ``op_class``."""
    op_type = op_class.__dict__.get("op_type")
    if not isinstance(op_type, str):
        raise SerializationError(
            f"{op_class.__name__} does not define its own op_type; every "
            "serializable operation class needs a distinct op_type"
        )

    def deco(builder: Builder) -> Builder:
        old = _BUILDERS.get(op_type)
        if old is not None and old.op_class is not op_class:
            raise SerializationError(
                f"op_type {op_type!r} is already registered for "
                f"{old.op_class.__module__}.{old.op_class.__name__}; "
                f"{op_class.__module__}.{op_class.__name__} needs another op_type"
            )
        _BUILDERS[op_type] = Registration(op_class, builder)
        return builder

    return deco


def registration(op_type: str) -> Registration | None:
    return _BUILDERS.get(op_type)


def registered_op_types() -> dict[str, type[Operation]]:
    """``{op_type: op class}`` of every operation the format can hold."""
    return {k: r.op_class for k, r in sorted(_BUILDERS.items())}

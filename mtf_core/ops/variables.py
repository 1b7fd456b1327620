"""Variables and assignments.

``get_variable`` returns the variable's value tensor (as in Mesh TensorFlow);
``assign``/``assign_add``/``assign_sub`` accept that tensor or the Variable op.
An initializer is any TF2 initializer: ``callable(shape, dtype)`` called once
with the full shape (the value is then sliced, so layouts never change it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ArgumentError, GraphError, ShapeError
from mtf_core.graph import Mesh, Operation, Tensor
from mtf_core.ops.elementwise import cast
from mtf_core.shapes import convert_to_shape


class Variable(Operation):
    """A trainable (or not) value that lives across steps, one slice per device."""

    op_type = "Variable"
    stateful = True

    def __init__(
        self,
        mesh: Mesh,
        name: str,
        shape: Any,
        dtype: Any = "float32",
        initializer: Any = None,
        trainable: bool = True,
    ) -> None:
        super().__init__([], mesh=mesh, name=name)
        if initializer is not None and not callable(initializer):
            raise GraphError(
                f"variable {name!r}: initializer {initializer!r} is not callable; "
                "expected callable(shape, dtype), e.g. tf.keras.initializers.Zeros()"
            )
        self.initializer = initializer
        self.trainable = trainable
        self._add_output(convert_to_shape(shape), dtypes.as_dtype_name(dtype))
        mesh.graph.all_variables.append(self)
        if trainable:
            mesh.graph.trainable_variables.append(self)

    @property
    def shape(self) -> Any:
        return self.outputs[0].shape

    @property
    def dtype(self) -> str:
        return self.outputs[0].dtype

    @property
    def value(self) -> Tensor:
        return self.outputs[0]

    @property
    def size_bytes(self) -> int:
        return self.outputs[0].size_bytes

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return []

    def lower(self, lowering: Any) -> None:
        impl = lowering.mesh_impl(self)
        laid = impl.read_variables(lowering.variables.slices(self))
        lowering.set_tensor_lowering(self.outputs[0], laid)

    def attrs(self) -> dict[str, Any]:
        init = self.initializer
        desc = None if init is None else getattr(type(init), "__name__", repr(init))
        return {"trainable": self.trainable, "initializer": desc}


def get_variable(
    mesh: Mesh,
    name: str,
    shape: Any,
    dtype: Any = "float32",
    initializer: Any = None,
    trainable: bool = True,
    activation_dtype: Any = None,
) -> Tensor:
    """Creates a variable and returns its value tensor."""
    v = Variable(mesh, name, shape, dtype, initializer, trainable).outputs[0]
    if (
        activation_dtype is not None
        and dtypes.as_dtype_name(activation_dtype) != v.dtype
    ):
        return cast(v, activation_dtype)
    return v


def as_variable(var: Any) -> Variable:
    if isinstance(var, Tensor):
        var = var.operation
    if not isinstance(var, Variable):
        raise GraphError(f"{var!r} is not an mtf variable (or its value tensor)")
    return var


#: Assign modes, with the MeshImpl.assign_variables mode each lowers to.
ASSIGN_MODES = {"assign": "assign", "assign_add": "add", "assign_sub": "sub"}


class Assign(Operation):
    """Sets (``assign``), increments or decrements a variable in place."""

    op_type = "Assign"
    stateful = True

    def __init__(
        self,
        var: Variable,
        value: Tensor,
        mode: str = "assign",
        name: str | None = None,
    ) -> None:
        if mode not in ASSIGN_MODES:
            raise ArgumentError(
                f"assign: mode {mode!r} is unknown; expected one of "
                f"{sorted(ASSIGN_MODES)}"
            )
        if value.shape != var.shape:
            raise ShapeError(
                f"assign: value {value.name} has shape [{value.shape}] but variable "
                f"{var.name} has shape [{var.shape}]"
            )
        if value.dtype != var.dtype:
            value = cast(value, var.dtype)
        super().__init__([var.outputs[0], value], name=name or f"{mode}_{var.name}")
        self.variable = var
        self.mode = mode

    def flops(self) -> float:
        return 0.0 if self.mode == "assign" else float(self.variable.outputs[0].size)

    @property
    def has_gradient(self) -> bool:
        return False

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return [None, None]

    def lower(self, lowering: Any) -> None:
        impl = lowering.mesh_impl(self)
        laid = lowering.tensors[self.inputs[1]]
        lowering.lowered_operations[self] = impl.assign_variables(
            lowering.variables.slices(self.variable), laid, ASSIGN_MODES[self.mode]
        )

    def attrs(self) -> dict[str, Any]:
        return {"mode": self.mode, "variable": self.variable.name}


def assign(var: Any, new_val: Tensor, name: str | None = None) -> Assign:
    return Assign(as_variable(var), new_val, "assign", name)


def assign_add(var: Any, new_val: Tensor, name: str | None = None) -> Assign:
    return Assign(as_variable(var), new_val, "assign_add", name)


def assign_sub(var: Any, new_val: Tensor, name: str | None = None) -> Assign:
    return Assign(as_variable(var), new_val, "assign_sub", name)

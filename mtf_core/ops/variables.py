"""Variables and assignments.

``get_variable`` returns the variable's value tensor (as in Mesh TensorFlow);
``assign``/``assign_add``/``assign_sub`` accept that tensor or the Variable op.
An initializer is any TF2 initializer: ``callable(shape, dtype)`` called once
with the full shape (the value is then sliced, so layouts never change it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mtf_core import dtypes, weight_handoff
from mtf_core.errors import ArgumentError, GraphError, GraphTypeError, ShapeError
from mtf_core.graph import Mesh, Operation, Tensor
from mtf_core.ops.elementwise import CastOp, cast
from mtf_core.seams import LoweringContext
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
        self.variable_dtype = dtypes.as_variable_dtype(dtype)
        # The output is the stored value (slice dtype); get_variable casts it
        # to the activation dtype, so gradients reach the variable in the
        # dtype it is updated in.
        self._add_output(convert_to_shape(shape), self.variable_dtype.slice_dtype)
        mesh.graph.all_variables.append(self)
        if trainable:
            mesh.graph.trainable_variables.append(self)
        mesh.variable_created(self)

    @property
    def master_dtype(self) -> str:
        """The dtype a checkpoint (``VariableStore.export``) holds."""
        return str(self.variable_dtype.master_dtype)

    @property
    def slice_dtype(self) -> str:
        """The dtype each device's slice is stored and updated in."""
        return str(self.variable_dtype.slice_dtype)

    @property
    def activation_dtype(self) -> str:
        """The dtype :func:`get_variable` returns."""
        return str(self.variable_dtype.activation_dtype)

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

    def lower(self, lowering: LoweringContext) -> None:
        impl = lowering.mesh_impl(self)
        laid = impl.read_variables(lowering.variables.slices(self))
        lowering.set_tensor_lowering(self.outputs[0], laid)

    def attrs(self) -> dict[str, Any]:
        init = self.initializer
        desc = None if init is None else getattr(type(init), "__name__", repr(init))
        out: dict[str, Any] = {"trainable": self.trainable, "initializer": desc}
        vd = self.variable_dtype
        if vd.master_dtype != vd.slice_dtype or vd.activation_dtype != vd.slice_dtype:
            out["variable_dtype"] = [
                vd.master_dtype,
                vd.slice_dtype,
                vd.activation_dtype,
            ]
        return out


def get_variable(
    mesh: Mesh,
    name: str,
    shape: Any,
    dtype: Any = "float32",
    master_dtype: Any = None,
    slice_dtype: Any = None,
    activation_dtype: Any = None,
    initializer: Any = None,
    trainable: bool = True,
    **kwargs: Any,
) -> Tensor:
    """Creates a variable and returns its value in the activation dtype.

    ``dtype`` is a dtype or a :class:`~mtf_core.dtypes.VariableDType`
    (Mesh TensorFlow's signature; ``master_dtype``/``slice_dtype``/
    ``activation_dtype`` override what a plain dtype implies).  When the
    activation dtype differs from the slice dtype the value is an mtf ``cast``
    of the variable, so gradients and assignments are cast back.

    >>> import mtf_core as mtf
    >>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
    >>> w = get_variable(m, "w", "d:4", mtf.VariableDType("float32", None, "bfloat16"))
    >>> (w.dtype, as_variable(w).dtype)
    ('bfloat16', 'float32')
    """
    if not isinstance(name, str) or not name:
        # Variables are found again, and checkpointed, by name.
        raise GraphError(
            f"get_variable: name {name!r} is not a non-empty string; expected a "
            "name such as 'w1'"
        )
    if not isinstance(mesh, Mesh):
        raise GraphTypeError(
            f"get_variable {name!r}: mesh {mesh!r} is not an mtf.Mesh; expected "
            "mtf.Mesh(graph, name)"
        )
    if kwargs:
        raise ArgumentError(
            f"get_variable {name!r}: unknown arguments {sorted(kwargs)}; "
            "expected dtype, master_dtype, slice_dtype, activation_dtype, "
            "initializer, trainable"
        )
    vd = dtypes.as_variable_dtype(dtype, master_dtype, slice_dtype, activation_dtype)
    shape = convert_to_shape(shape)
    from mtf_core.ops.stored import (
        StoredRead,
        note_read,
        storage_renames,
        storage_shape,
    )

    again = weight_handoff.provided(mesh.graph, name, shape)
    if again is not None:  # a recomputed block asks for its weight again
        return again
    # Stored under other dim names (mtf_core.ops.stored) when a policy says so.
    renames = storage_renames(mesh.graph, name, shape)
    stored = storage_shape(shape, renames)
    full_name = scoped_name(name)
    known = mesh.graph.variables_by_name
    existing = known.get(full_name)
    if existing is None:
        existing = known[full_name] = Variable(
            mesh, full_name, stored, vd, initializer, trainable
        )
    elif existing.shape != stored or existing.mesh is not mesh:
        raise ShapeError(
            f"get_variable {full_name!r}: the graph's variable of that name has "
            f"shape [{existing.shape}] on mesh {existing.mesh.name!r}; asked for "
            f"[{stored}] on {mesh.name!r}"
        )
    v = existing.outputs[0]
    if vd.activation_dtype != v.dtype:
        v = cast(v, vd.activation_dtype, name=f"{v.operation.name}/read")
    if renames:
        v = StoredRead(v, shape).outputs[0]
    weight_handoff.record(mesh.graph, name, v)
    note_read(mesh.graph, name, full_name, shape, v)  # slots-only sharding
    return v


_SCOPE_PROVIDER: list[Callable[[], str]] = []


def set_variable_scope_provider(provider: Callable[[], str] | None) -> None:
    """Installs ``provider() -> "outer/inner"``, the scope ``get_variable``
    prefixes names with (Mesh TensorFlow programs name variables by
    ``tf.variable_scope``; a compatibility layer that can read TensorFlow's
    scope installs a provider); None removes it."""
    _SCOPE_PROVIDER.clear()
    if provider is not None:
        _SCOPE_PROVIDER.append(provider)


def scoped_name(name: str) -> str:
    """``name`` as :func:`get_variable` stores it: under the installed scope
    (see :func:`set_variable_scope_provider`), if any."""
    scope = _SCOPE_PROVIDER[0]() if _SCOPE_PROVIDER else ""
    return f"{scope}/{name}" if scope else name


def as_variable(var: Any) -> Variable:
    if isinstance(var, Tensor):
        var = var.operation
    if getattr(var, "op_type", None) == "StoredRead":
        var = var.inputs[0].operation  # a stored variable's read: its value
    if isinstance(var, CastOp) and isinstance(var.inputs[0].operation, Variable):
        # get_variable's value in another activation dtype: its variable.
        var = var.inputs[0].operation
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

    def lower(self, lowering: LoweringContext) -> None:
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

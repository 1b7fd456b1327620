"""Graph, Mesh, Tensor and Operation: the Python structure a program builds.

A graph is a list of operations in creation order (which is a valid
topological order).  Nothing here knows about TensorFlow: each operation says
its output shape, which dimensions it can be split over, its flops, its
gradient and how it lowers, and :mod:`mtf_core.lowering` does the rest.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mtf_core import dtypes
from mtf_core.errors import DTypeError, GraphError, GraphTypeError, ShapeError
from mtf_core.shapes import Shape, convert_to_shape

if TYPE_CHECKING:
    from mtf_core.comm import CollectiveSpec, LayoutContext
    from mtf_core.ops.stored import SlotSharding
    from mtf_core.ops.variables import Variable
    from mtf_core.seams import LoweringContext


class Graph:
    """A Mesh TensorFlow graph: operations in creation (topological) order."""

    def __init__(self) -> None:
        self.operations: list[Operation] = []
        self.all_variables: list[Variable] = []
        self.trainable_variables: list[Variable] = []
        self._names_in_use: dict[str, int] = {}  # lower-cased name -> uses
        self.meshes: list[Mesh] = []
        # Kept on the graph, not in tables keyed by it, so that they go with
        # it: their values refer to the graph, which a table would keep alive.
        #: ``get_variable``'s variables by full name (asked again, a name
        #: returns the same variable, as in Mesh TensorFlow).
        self.variables_by_name: dict[str, Variable] = {}
        #: Variables updated under slot names (``mtf_core.ops.stored``).
        self.slot_shardings: dict[str, SlotSharding] = {}

    def unique_name(self, name: str, mark_as_used: bool = True) -> str:
        """``name``, or ``name_N`` if taken; as in TensorFlow (and Mesh TF),
        names differing only in case count as taken.

        >>> g = Graph()
        >>> [g.unique_name(n) for n in ("a", "A", "a_1", "a")]
        ['a', 'A_1', 'a_1_1', 'a_2']
        """
        key = name.lower()
        uses = self._names_in_use.get(key, 0)
        if mark_as_used:
            self._names_in_use[key] = uses + 1
        if uses == 0:
            return name
        # Skip suffixes already taken, including names a caller chose
        # ("a_1" given explicitly makes the next "a" become "a_2").
        base = key
        while key in self._names_in_use:
            key = f"{base}_{uses}"
            uses += 1
        if mark_as_used:
            self._names_in_use[key] = 1
        return f"{name}_{uses - 1}"

    def _add_operation(self, op: Operation, name: str) -> None:
        """Appends ``op`` to :attr:`operations` under a unique form of
        ``name``, noting its place there (``op.graph_index``)."""
        op.name = self.unique_name(name)
        op.graph_index = len(self.operations)
        self.operations.append(op)

    @property
    def tensors(self) -> list[Tensor]:
        return [t for op in self.operations for t in op.outputs]

    def capture_operations(self, fn: Callable[[], Any]) -> tuple[Any, list[Operation]]:
        """``fn()`` and the operations it added (Mesh TF's API).

        >>> g = Graph(); m = Mesh(g, "m")
        >>> from mtf_core.ops.creation import zeros
        >>> _, ops = g.capture_operations(lambda: zeros(m, "a:2") + 1.0)
        >>> [op.op_type for op in ops]
        ['Constant', 'Constant', 'Binary']
        """
        n = len(self.operations)
        out = fn()
        return out, self.operations[n:]

    def clone_operations(
        self, ops: Sequence[Operation], input_mapping: Mapping[Tensor, Tensor]
    ) -> tuple[list[Operation], dict[Tensor, Tensor]]:
        """Copies of ``ops`` (in their order) reading ``input_mapping[t]``
        wherever an original reads ``t``, as Mesh TF's ``clone_operations``.

        Returns the copies and ``input_mapping`` extended by each original
        output to its copy's.  Stateful operations (variables, random numbers,
        assignments, loops) are not copied: their outputs are read as they
        are, so a copy of a block with dropout sees the forward pass's masks.
        A mapped tensor keeps its shape and dtype.
        """
        mapping: dict[Tensor, Tensor] = {}
        for t, u in dict(input_mapping).items():
            for x in (t, u):
                check_tensor(x, "clone_operations: input_mapping tensor")
                if x.graph is not self:
                    raise GraphError(
                        f"clone_operations: tensor {x.name} belongs to another graph"
                    )
            if t.shape != u.shape or t.dtype != u.dtype:
                raise ShapeError(
                    f"clone_operations: {t.name} [{t.shape}] {t.dtype} is mapped to "
                    f"{u.name} [{u.shape}] {u.dtype}; expected the same shape and dtype"
                )
            mapping[t] = u
        clones: list[Operation] = []
        for op in ops:
            if not isinstance(op, Operation) or op.graph is not self:
                raise GraphError(
                    f"clone_operations: {op!r} is not an operation of this graph"
                )
            if op.stateful:
                continue
            for t in op.outputs:
                if t in mapping:
                    raise GraphError(
                        f"clone_operations: input_mapping maps {t.name}, an output of "
                        f"{op.name}, which is cloned; map only its inputs"
                    )
            clone = op._clone([mapping.get(t, t) for t in op.inputs])
            mapping.update(zip(op.outputs, clone.outputs))
            clones.append(clone)
        return clones, mapping

    def operation_by_name(self, name: str) -> Operation:
        for op in self.operations:
            if op.name == name:
                return op
        raise GraphError(f"graph has no operation named {name!r}")

    def __repr__(self) -> str:
        return f"<mtf.Graph with {len(self.operations)} operations>"


class Mesh:
    """A named mesh of processors a tensor lives on (shape given at lowering).

    ``variable_placer`` (Mesh TF's third argument, e.g.
    ``mtf.utils.BalancedVariablePlacer``) chooses the devices of the master
    variables that TF1 graph-mode programs create.
    """

    def __init__(self, graph: Graph, name: str, variable_placer: Any = None) -> None:
        if not isinstance(graph, Graph):
            raise GraphError(f"Mesh needs an mtf.Graph, got {graph!r}")
        if not isinstance(name, str) or not name:
            raise GraphTypeError(
                f"mesh name {name!r}: expected a non-empty string (the name its "
                "layout's mesh implementation is keyed by)"
            )
        self.graph = graph
        self.name = name
        self.variable_placer = variable_placer
        graph.meshes.append(self)

    def variable_created(self, var: Any) -> None:
        """Called by each new variable on this mesh: a placer that makes
        master variables (``mtf.utils.BalancedVariablePlacer`` in TF1 graph
        mode) makes this one's now, as Mesh TF's ``get_variable`` does."""
        make = getattr(self.variable_placer, "make_master", None)
        if make is not None:
            make(var)

    @property
    def variable_placer_fn(self) -> Any:
        """The placer's TF device function, or ``"cpu:0"`` without a placer."""
        if self.variable_placer is not None:
            return self.variable_placer.device_function
        return "cpu:0"

    def __repr__(self) -> str:
        return f"Mesh({self.name!r})"


class Tensor:
    """A distributed tensor: a named shape and a dtype, produced by an operation."""

    __array_priority__ = 100

    def __init__(
        self, operation: Operation, shape: Shape, dtype: Any, index: int
    ) -> None:
        self.operation = operation
        self.shape = convert_to_shape(shape)
        self.dtype = dtypes.as_dtype_name(dtype)
        self.index = index

    @property
    def name(self) -> str:
        return f"{self.operation.name}:{self.index}"

    @property
    def mesh(self) -> Mesh:
        return self.operation.mesh

    @property
    def graph(self) -> Graph:
        return self.operation.graph

    @property
    def size(self) -> int:
        return self.shape.size

    @property
    def size_bytes(self) -> int:
        return self.shape.size * dtypes.size_bytes(self.dtype)

    def __repr__(self) -> str:
        return f"Tensor[{self.name}, {self.shape}, {self.dtype}]"

    # Arithmetic with named-dimension broadcasting (see ops.elementwise).
    def __add__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.multiply(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.multiply(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.divide(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.divide(other, self)

    def __floordiv__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.floordiv(self, other)

    def __rfloordiv__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.floordiv(other, self)

    def __mod__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.mod(self, other)

    def __rmod__(self, other: Any) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.mod(other, self)

    def __neg__(self) -> Tensor:
        from mtf_core.ops import elementwise

        return elementwise.negative(self)

    __hash__ = object.__hash__


class DimNames(frozenset[str]):
    """A frozenset of dimension names that also returns itself when called:
    ``op.splittable_dims`` is a set, as in Mesh TF, and
    ``op.splittable_dims()`` still works for mtf_core's callers."""

    __slots__ = ()

    def __call__(self) -> DimNames:
        return self


class OperationMeta(type):
    """Operation's metaclass: an op whose constructor raises leaves nothing
    in its graph.  ``Operation.__init__`` adds the op to its graph before a
    subclass checks the rest of its arguments (an einsum's output shape, a
    constant's value), so a failed construction is undone here: the op, and
    whatever was added after it, leave the graph again (their names stay
    taken), and the graph lowers and saves as if the call had not been
    made."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        op = _new_object(cls)  # no op class defines __new__
        try:
            op.__init__(*args, **kwargs)
        except BaseException:
            op._withdraw()
            raise
        return op


_new_object: Callable[[type], Any] = object.__new__


class Operation(metaclass=OperationMeta):
    """Base class of every operation.

    Subclasses call ``super().__init__(inputs, mesh, name)``, then
    ``self._add_output(shape, dtype)`` for each output, and set
    ``self._unsplittable`` to the dimension names that must stay whole.

    The planner reads :meth:`splittable_dims`, :meth:`unsplittable_dims` and
    :meth:`flops`; autodiff calls :meth:`gradient`; the lowering calls
    :meth:`lower`; serialization calls :meth:`attrs`.
    """

    #: Operation type name used in serialization and counters.
    op_type: str = "Operation"
    #: Stateful operations (assignments, random numbers) are never merged or pruned
    #: as pure computations.
    stateful: bool = False
    #: Unique within its graph (:meth:`Graph.unique_name`).
    name: str
    _mesh: Mesh
    #: Where this op is in ``graph.operations``, which only grows; -1 for an
    #: op made without :meth:`Graph._add_operation`.
    graph_index: int = -1

    def __init__(
        self,
        inputs: Sequence[Tensor],
        mesh: Mesh | None = None,
        name: str | None = None,
    ) -> None:
        inputs = list(inputs)
        for t in inputs:
            if not isinstance(t, Tensor):
                check_tensor(t, f"{type(self).__name__} input")  # raises
        if mesh is None:
            if not inputs:
                raise GraphError(f"{type(self).__name__} needs a mesh or inputs")
            mesh = inputs[0].operation._mesh
        elif not isinstance(mesh, Mesh):
            raise GraphTypeError(
                f"{type(self).__name__}: mesh {mesh!r} is not an mtf.Mesh; expected "
                "mtf.Mesh(graph, name)"
            )
        if name is not None and not isinstance(name, str):
            raise GraphError(
                f"{type(self).__name__}: name {name!r} is not a string; expected a "
                "name such as 'my_op' (or None)"
            )
        graph = mesh.graph
        for t in inputs:
            if t.operation._mesh.graph is not graph:  # t.graph, without 2 calls
                raise GraphError(
                    f"tensor {t.name} belongs to another graph than mesh {mesh.name!r}"
                )
        self._inputs = inputs
        self._outputs: list[Tensor] = []
        self._mesh = mesh
        self._unsplittable: frozenset[str] = frozenset()
        self._dim_names: frozenset[str] | None = None  # all_dim_names, cached
        graph._add_operation(self, name or self.op_type.lower())

    def _withdraw(self) -> None:
        """Takes this op, and every op added after it, out of its graph (see
        :class:`OperationMeta`); nothing if it was never added."""
        index = self.graph_index
        mesh = self.__dict__.get("_mesh")
        if index < 0 or mesh is None:
            return
        graph = mesh.graph
        ops = graph.operations
        if index >= len(ops) or ops[index] is not self:
            return  # withdrawn already
        gone = set(map(id, ops[index:]))
        del ops[index:]
        for kept in (graph.all_variables, graph.trainable_variables):
            kept[:] = [v for v in kept if id(v) not in gone]

    def _clone(self, inputs: list[Tensor]) -> Operation:
        """A copy of this op reading ``inputs`` (of the same shapes), added
        to the graph under a fresh name (:meth:`Graph.clone_operations`)."""
        clone = copy.copy(self)
        for klass in type(self).__mro__:  # what was worked out from the inputs
            for name, attr in vars(klass).items():
                if isinstance(attr, functools.cached_property):
                    clone.__dict__.pop(name, None)
        clone._dim_names = None
        clone._inputs = inputs
        clone._outputs = [
            Tensor(clone, t.shape, t.dtype, i) for i, t in enumerate(self._outputs)
        ]
        self.graph._add_operation(clone, self.name)
        return clone

    def _add_output(self, shape: Any, dtype: Any) -> Tensor:
        t = Tensor(self, convert_to_shape(shape), dtype, len(self._outputs))
        self._outputs.append(t)
        self._dim_names = None
        return t

    @property
    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[Tensor]:
        return list(self._outputs)

    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def graph(self) -> Graph:
        return self._mesh.graph

    # -- what the planner reads ---------------------------------------------
    @property
    def sub_operations(self) -> list[Operation]:
        """Operations nested inside this one (a loop's body), whose tensors'
        dims the planner lays out with the graph's; none for most ops."""
        return []

    @property
    def all_dim_names(self) -> frozenset[str]:
        # Cached: the planner asks every op many times, and an op's tensors
        # never change once its outputs are added.
        names = self._dim_names
        if names is None:
            names = self._dim_names = frozenset(
                d.name
                for t in itertools.chain(self._inputs, self._outputs)
                for d in t.shape.dims
            )
        return names

    @property
    def unsplittable_dims(self) -> DimNames:
        """Dimension names this op cannot work on when split."""
        return DimNames(self._unsplittable)

    @property
    def splittable_dims(self) -> DimNames:
        """Dimension names this op can work on when split."""
        return DimNames(self.all_dim_names - self._unsplittable)

    def flops(self) -> float:
        """Floating point operations of the whole (unsplit) op.

        Default: one per output element.
        """
        return float(sum(t.size for t in self._outputs))

    def communication(self, ctx: LayoutContext) -> list[CollectiveSpec]:
        """The collectives (:class:`mtf_core.comm.CollectiveSpec`) lowering this op
        issues under ``ctx`` (a :class:`mtf_core.comm.LayoutContext`), in order.
        Must agree exactly with what :meth:`lower` records.  Default: none."""
        return []

    # -- autodiff and lowering ---------------------------------------------
    @property
    def has_gradient(self) -> bool:
        return True

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        raise NotImplementedError(f"{self.op_type} ({self.name}) has no gradient")

    def gradient_for(
        self, grad_ys: Sequence[Tensor | None], needed: Sequence[bool]
    ) -> list[Tensor | None]:
        """What ``mtf.gradients`` calls: :meth:`gradient`, where ``needed[i]``
        says whether input ``i``'s gradient is asked for (an op that can skip
        the others overrides this)."""
        return self.gradient(grad_ys)

    def lower(self, lowering: LoweringContext) -> None:
        """Makes this op's TensorFlow work through ``lowering`` (the seam,
        :class:`mtf_core.seams.LoweringContext`): ``lowering.tf``, the
        laid-out inputs in ``lowering.tensors`` and the primitives of
        ``lowering.mesh_impl(self)``."""
        raise NotImplementedError(f"{self.op_type} ({self.name}) cannot be lowered")

    def attrs(self) -> dict[str, Any]:
        """JSON-able attributes that, with the inputs, rebuild this op."""
        return {}

    def __repr__(self) -> str:
        ins = ", ".join(t.name for t in self._inputs)
        return f"<{self.op_type} {self.name}({ins})>"


def check_tensor(x: Any, what: str) -> Tensor:
    """``x`` if it is an mtf.Tensor; a GraphTypeError naming it otherwise
    (a NumPy array or None where a tensor belongs)."""
    if not isinstance(x, Tensor):
        raise GraphTypeError(f"{what} {x!r} is not an mtf.Tensor")
    return x


def check_same_mesh(tensors: Iterable[Tensor]) -> Mesh:
    """The mesh ``tensors`` share; raises GraphError naming two that differ."""
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            check_tensor(t, "input")  # raises
    if not tensors:
        raise GraphError("expected at least one mtf.Tensor, got none")
    mesh = tensors[0].operation._mesh  # .mesh, without the property
    for t in tensors[1:]:
        if t.operation._mesh is not mesh:
            raise GraphError(
                f"tensors {tensors[0].name} and {t.name} live on different meshes "
                f"({mesh.name!r}, {t.mesh.name!r})"
            )
    return mesh


def check_same_shape(tensors: Iterable[Tensor], what: str) -> Shape:
    """The shape ``tensors`` share; raises ShapeError naming two that differ."""
    tensors = list(tensors)
    shape = tensors[0].shape
    for t in tensors[1:]:
        if t.shape != shape:
            raise ShapeError(
                f"{what}: {t.name} has shape [{t.shape}] but {tensors[0].name} has "
                f"[{shape}]; the tensors must have one shape"
            )
    return shape


def check_same_dtype(tensors: Iterable[Tensor], what: str) -> str:
    """The dtype ``tensors`` share; raises DTypeError naming two that differ."""
    tensors = list(tensors)
    dt = tensors[0].dtype
    for t in tensors[1:]:
        if t.dtype != dt:
            raise DTypeError(
                f"{what}: dtypes differ: {tensors[0].name} is {dt}, {t.name} is "
                f"{t.dtype}; cast one of them first"
            )
    return dt

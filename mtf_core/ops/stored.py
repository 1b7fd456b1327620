"""Variables stored split over a mesh axis their computation does not split.

ZeRO / FSDP in named dims.  Layout rules give one mesh axis per dim *name*,
so a weight ``[d_model, d_ff]`` can never be split over the axis that splits
``batch`` (``d_model`` shares activations with ``batch``).  A variable may
instead be *stored* under other names (``[d_model_stored_ffn, d_ff]``): the
storage name appears only in the variable, its optimizer slots and its update,
so a rule may put it on the data axis.  Reading the variable renames it back
(:class:`StoredRead`: an allgather when the storage name is split), and the
gradient of that read is a :class:`ReduceScatter`: the pending sum of the
gradient over the data axis is reduce-scattered straight into the stored
layout instead of being allreduced whole.  The optimizer then updates only each
device's shard of the weight and of its slots.

Whether a storage name is split, and over which axis, is an ordinary layout
rule, so the planner chooses it per variable class (one storage name per class)
in the same integer program as everything else, under the memory constraint.

*Optimizer slots only* (ZeRO-1, Megatron-LM's distributed optimizer): under
:func:`slot_names` a variable keeps its (whole) value for the model to read,
but its optimizer works under another name (``[d_model_slots_ffn, d_ff]``):
the gradient of the variable's read is reduce-scattered into that name, the
slots live there, each device updates its shard of the variable, and the
updated shard is renamed back (an allgather when the slot name is split).
:mod:`mtf_core.optimize` builds that chain for the variables
:func:`slot_sharding` names; nothing is gathered on read.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> with stored_names(g, lambda name, shape: {"d": "d_stored"}):
...     w = mtf.get_variable(m, "w", "d:4,e:2")
>>> (str(w.shape), str(w.operation.inputs[0].shape))
('d:4,e:2', 'd_stored:4,e:2')
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtf_core.comm import CollectiveSpec, LayoutContext, allreduce_collectives
from mtf_core.errors import GraphError, LoweringError
from mtf_core.graph import Graph, Tensor
from mtf_core.ops.reshape import Reshape, plan_reshape
from mtf_core.seams import LoweringContext
from mtf_core.shapes import Shape, convert_to_shape

#: ``policy(variable name, shape) -> {dim name: storage name}`` ({} = as is).
StoragePolicy = Callable[[str, Shape], Mapping[str, str]]

_POLICIES: weakref.WeakKeyDictionary[Graph, StoragePolicy] = weakref.WeakKeyDictionary()
_SLOT_POLICIES: weakref.WeakKeyDictionary[Graph, StoragePolicy] = (
    weakref.WeakKeyDictionary()
)

#: The counters' kind of a reduce-scatter (see ``mtf_core.lowering.counters``).
REDUCE_SCATTER = "reducescatter"


@contextlib.contextmanager
def stored_names(graph: Graph, policy: StoragePolicy) -> Iterator[None]:
    """While active, ``get_variable`` on ``graph`` stores each variable with
    the dims ``policy(name, shape)`` renames (see the module docstring)."""
    if not callable(policy):
        raise GraphError(
            f"stored_names: policy {policy!r} is not callable; expected "
            "policy(variable name, shape) -> {dim name: storage name}"
        )
    previous = _POLICIES.get(graph)
    _POLICIES[graph] = policy
    try:
        yield
    finally:
        if previous is None:
            _POLICIES.pop(graph, None)
        else:
            _POLICIES[graph] = previous


@contextlib.contextmanager
def slot_names(graph: Graph, policy: StoragePolicy) -> Iterator[None]:
    """While active, ``get_variable`` on ``graph`` notes, for each variable
    ``policy(name, shape)`` renames, that its optimizer updates it (and keeps
    its slots) under those names: optimizer slots only sharding (see the
    module docstring).  ``shape`` is the shape the model reads."""
    if not callable(policy):
        raise GraphError(
            f"slot_names: policy {policy!r} is not callable; expected "
            "policy(variable name, shape) -> {dim name: slot name}"
        )
    previous = _SLOT_POLICIES.get(graph)
    _SLOT_POLICIES[graph] = policy
    try:
        yield
    finally:
        if previous is None:
            _SLOT_POLICIES.pop(graph, None)
        else:
            _SLOT_POLICIES[graph] = previous


@dataclass
class SlotSharding:
    """A variable updated under other names: ``slot_shape`` (the read shape
    with the slot names), and the tensors ``get_variable`` returned for it
    (the reads whose gradients the optimizer reduce-scatters)."""

    slot_shape: Shape
    reads: list[Tensor]


def note_read(
    graph: Graph, name: str, full_name: str, shape: Shape, read: Tensor
) -> None:
    """Called by ``get_variable``: ``read`` is what it returned for variable
    ``full_name`` (asked for as ``name``, read shape ``shape``); recorded when
    the active slot policy renames it."""
    policy = _SLOT_POLICIES.get(graph)
    if policy is None:
        return
    renames = _checked(name, shape, policy(name, shape))
    if not renames:
        return
    table = graph.slot_shardings
    entry = table.get(full_name)
    if entry is None:
        table[full_name] = SlotSharding(storage_shape(shape, renames), [read])
    elif not any(r is read for r in entry.reads):
        entry.reads.append(read)


def slot_sharding(graph: Graph, full_name: str) -> SlotSharding | None:
    """How variable ``full_name`` of ``graph`` is updated under slot names, or
    None (updated as it is stored)."""
    return graph.slot_shardings.get(full_name)


def storage_renames(graph: Graph, name: str, shape: Shape) -> dict[str, str]:
    """The renames the active policy of ``graph`` gives variable ``name``
    (checked: existing dims, new names not already in the shape)."""
    policy = _POLICIES.get(graph)
    if policy is None:
        return {}
    return _checked(name, shape, policy(name, shape))


def _checked(name: str, shape: Shape, given: Mapping[str, str]) -> dict[str, str]:
    renames = dict(given)
    names = shape.dimension_names
    for old, new in renames.items():
        if old not in names:
            raise GraphError(
                f"storage policy renames {old!r} of variable {name!r} [{shape}], "
                f"which has no such dimension; expected one of {names}"
            )
        if new in names:
            raise GraphError(
                f"storage policy renames {old!r} of variable {name!r} [{shape}] "
                f"to {new!r}, a name the variable already has"
            )
    return renames


def storage_shape(shape: Shape, renames: Mapping[str, str]) -> Shape:
    """``shape`` with its dims renamed for storage."""
    for old, new in renames.items():
        shape = shape.rename_dimension(old, new)
    return shape


class StoredRead(Reshape):
    """The stored value renamed to the names the model computes with.

    Lowers and costs as a rename (an allconcat over the axis that splits a
    storage name); its gradient is a :class:`ReduceScatter`.
    """

    op_type = "StoredRead"

    def __init__(self, x: Tensor, shape: Shape, name: str | None = None) -> None:
        super().__init__(x, shape, name=name or f"{x.operation.name}/stored_read")

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        if dy is None:
            return [None]
        return [ReduceScatter(dy, self.inputs[0].shape).outputs[0]]


class ReduceScatter(Reshape):
    """A rename whose input may be a pending sum: reduce-scatters it.

    When the input is an allreduce(SUM) still pending over mesh axis ``m``,
    and the output's renamed dim is split over ``m`` where the input's is not
    (and nothing else about the layouts differs), each device receives only
    the sum of its own shard: one ``reducescatter`` over ``m`` (after an
    allreduce over any other pending axes).  Otherwise the sum is forced and
    the rename proceeds as a plain reshape.  ``consume_pending`` says what it
    issues, for the cost model (``cost_models.deferred``).
    """

    op_type = "ReduceScatter"

    def __init__(self, x: Tensor, shape: Any, name: str | None = None) -> None:
        super().__init__(x, convert_to_shape(shape), name=name or "reduce_scatter")

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        dy = grad_ys[0]
        return [None if dy is None else StoredRead(dy, self.inputs[0].shape).outputs[0]]

    def scatter_axis(
        self, ctx: LayoutContext, pending: Sequence[str]
    ) -> tuple[int, int] | None:
        """``(mesh axis, tensor axis)`` to reduce-scatter over when the input
        is pending over the mesh axes named ``pending``; None when the sum
        must be forced whole first."""
        x, out = self.inputs[0], self.outputs[0]
        in_layout = ctx.tensor_layout(x.shape)
        work = plan_reshape(ctx, x.shape, out.shape).in_work
        changed = [i for i, (a, b) in enumerate(zip(in_layout, work)) if a != b]
        if len(changed) != 1:
            return None
        i = changed[0]
        m = work[i]
        if (
            m is None
            or in_layout[i] is not None
            or ctx.live_axis(m) is None
            or ctx.axis_name(m) not in pending
        ):
            return None
        return m, i

    def consume_pending(
        self, ctx: LayoutContext, pending: Sequence[str], bytes_per_device: int
    ) -> list[CollectiveSpec]:
        """What reading the input, pending over ``pending``, issues: an
        allreduce over the other pending axes, then the reduce-scatter (or
        one allreduce over them all when no reduce-scatter applies)."""
        found = self.scatter_axis(ctx, pending)
        if found is None:
            return [CollectiveSpec("allreduce", tuple(pending), bytes_per_device)]
        m = found[0]
        names = ctx.mesh_shape.dimension_names
        rest = [names.index(a) for a in pending if a != ctx.axis_name(m)]
        x = self.inputs[0]
        return allreduce_collectives(ctx, x.shape, x.dtype, rest, pending=False) + [
            CollectiveSpec(
                REDUCE_SCATTER, (ctx.axis_name(m),), ctx.slice_bytes(x.shape, x.dtype)
            )
        ]

    def lower(self, lowering: LoweringContext) -> None:
        raw = lowering.raw_tensor(self.inputs[0])
        impl = lowering.mesh_impl(self)
        found = None
        if getattr(raw, "is_pending", False):
            found = self.scatter_axis(impl.ctx, impl.ctx.axis_names(raw.mesh_axes))
        if found is None:
            super().lower(lowering)  # forces the sum (if any), then renames
            return
        scatter = getattr(impl, "reduce_scatter", None)
        if scatter is None:
            raise LoweringError(
                f"{type(impl).__name__} cannot reduce-scatter ({self.name}); "
                "stored (sharded) variables lower on PlacementMeshImpl"
            )
        m, axis = found
        x, out = self.inputs[0], self.outputs[0]
        # The input's own pending sum is left pending: a later reader (there
        # is none in a model's gradient) would force it, as the cost model says.
        laid = impl.allreduce_for(
            raw.op, raw.laid_out, [a for a in raw.mesh_axes if a != m]
        )
        laid = scatter(laid, m, axis)
        out_work = plan_reshape(impl.ctx, x.shape, out.shape).out_work
        new_local = impl.ctx.local_shape(out.shape, out_work)
        tf = lowering.tf
        laid = impl.slicewise(lambda s: tf.reshape(s, new_local), laid)
        laid = impl.apply_layout_change(
            laid, out.shape, out_work, impl.tensor_layout(out.shape)
        )
        lowering.set_tensor_lowering(out, laid)

    def attrs(self) -> dict[str, Any]:
        return {"new_shape": str(self.outputs[0].shape)}

"""Structural signatures: units with equal signatures cost the same.

An op's signature is its type, its cost-relevant attributes, the shapes and
dtypes of its inputs and outputs, and its flops; a deferred group's adds
how its members are wired.  The same op in every layer of a deep model has
one signature, so the planner prices one of them and multiplies.

Signatures are interned :class:`Signature` tuples: equal signatures are one
object and hash once, because the planner groups tens of thousands of units
by them.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

from mtf_core.graph import Operation, Tensor
from mtf_core.shapes import Shape

# Attributes that name things or seed them, never changing what an op costs.
_COSTLESS_ATTRS = frozenset({"variable", "seed", "initializer"})
_SCALARS = frozenset({str, int, float, bool, type(None)})


class Signature(tuple[Hashable, ...]):
    """A tuple that computes its hash once."""

    _hash: int

    def __new__(cls, items: Iterable[Hashable]) -> Signature:
        self = super().__new__(cls, items)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Signature], tuple[tuple[Hashable, ...]]]:
        # Hashes of strings differ between processes: recompute on unpickling.
        return (Signature, (tuple(self),))


class Signer:
    """Computes and interns the signatures of one graph's ops and groups.

    Deep graphs repeat a few signatures thousands of times, so an op's
    signature is first looked up by a compact key (small integers standing
    for its attributes and its tensors' shapes and dtypes, plus its flops)
    and built only the first time that key is seen.
    """

    def __init__(self) -> None:
        self._interned: dict[Signature, Signature] = {}
        self._by_key: dict[Hashable, Signature] = {}
        self._tensor_ids: dict[Tensor, int] = {}
        self._tensor_keys: list[tuple[str, str]] = []
        self._key_ids: dict[tuple[str, str], int] = {}
        # Shape objects repeat: look them up by identity before by value.
        self._shape_keys_by_id: dict[int, tuple[Shape, str]] = {}
        self._shape_keys: dict[Shape, str] = {}
        self._attr_ids: dict[Hashable, tuple[int, str]] = {}

    def intern(self, items: Iterable[Hashable]) -> Signature:
        sig = Signature(items)
        return self._interned.setdefault(sig, sig)

    def op(self, op: Operation) -> Signature:
        """The signature of ``op``."""
        ins = op.inputs
        # Ops without inputs (constants, variables, placeholders) cost the
        # same whatever their values; skip their (possibly large) attributes.
        attr_id, attrs = self._attrs(op) if ins else (-1, "")
        in_ids = tuple([self._tensor_id(t) for t in ins])
        out_ids = tuple([self._tensor_id(t) for t in op.outputs])
        key = (type(op), op.op_type, attr_id, in_ids, out_ids, op.flops())
        sig = self._by_key.get(key)
        if sig is None:
            keys = self._tensor_keys
            sig = self._by_key[key] = self.intern(
                (
                    type(op).__name__,
                    op.op_type,
                    attrs if ins else (),
                    tuple([keys[i] for i in in_ids]),
                    tuple([keys[i] for i in out_ids]),
                    key[5],
                )
            )
        return sig

    def group(
        self,
        members: Sequence[Operation],
        exported: Sequence[Tensor],
        sigs: dict[Operation, Signature],
        kind: str,
    ) -> Signature:
        """The signature of a group of ``members`` (graph order) of which
        ``exported`` outputs are exported."""
        index = {op: i for i, op in enumerate(members)}
        wiring = tuple(
            tuple(
                (index[t.operation], t.index) if t.operation in index else None
                for t in op.inputs
            )
            for op in members
        )
        ex = tuple((index[t.operation], t.index) for t in exported)
        return self.intern((kind, tuple(sigs[op] for op in members), wiring, ex))

    def _attrs(self, op: Operation) -> tuple[int, str]:
        """A small id and the text of ``op``'s cost-relevant attributes."""
        items = op.attrs().items()
        # Plain scalar values (with their types: 1, 1.0 and True differ) key
        # the text directly; anything else is written out every time.
        raw: Hashable = None
        if all(type(v) in _SCALARS for _, v in items):
            raw = (type(op), tuple([(k, type(v), v) for k, v in items]))
            hit = self._attr_ids.get(raw)
            if hit is not None:
                return hit
        text = repr(sorted((k, v) for k, v in items if k not in _COSTLESS_ATTRS))
        hit = self._attr_ids.setdefault(text, (len(self._attr_ids), text))
        if raw is not None:
            self._attr_ids[raw] = hit
        return hit

    def _tensor_id(self, t: Tensor) -> int:
        i = self._tensor_ids.get(t)
        if i is None:
            shape = t.shape
            hit = self._shape_keys_by_id.get(id(shape))
            if hit is None or hit[0] is not shape:
                text = self._shape_keys.get(shape)
                if text is None:
                    text = self._shape_keys[shape] = ",".join(
                        [f"{d.name}:{d.size}" for d in shape.dims]
                    )
                hit = self._shape_keys_by_id[id(shape)] = (shape, text)
            key = (hit[1], t.dtype)
            i = self._key_ids.get(key)
            if i is None:
                i = self._key_ids[key] = len(self._tensor_keys)
                self._tensor_keys.append(key)
            self._tensor_ids[t] = i
        return i

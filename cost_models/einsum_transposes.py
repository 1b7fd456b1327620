"""Which operands TensorFlow's einsum kernel transposes, and how many bytes.

TensorFlow's ``Einsum`` kernel (and oneDNN's ``_MklEinsum``, which shares its
helper) runs a two-input einsum as one batched matmul:

* each label is *batch* (in both inputs and the output), *free* (in one input
  and the output), *contract* (in both inputs only) or *reduce* (in one input
  only); labels are numbered in order of first appearance in the equation;
* an input is used as it lies when its labels are ordered (type, number) with
  types ``batch < free < contract``, or ``batch < contract < free`` (the
  matmul's transpose flag); otherwise it is first transposed to the first
  order, a copy of its whole slice;
* the matmul's result has the batch labels, then the first input's free
  labels, then the second's, each by number; when the output asks another
  order, the result is transposed into it.

A transpose that only moves dims of size one is not counted: the slice's
bytes keep their order, so the kernel's copy runs at memory speed (on 8
logical CPUs, ``bhqk,bhkv->hbqv`` with ``b`` of size one took about 9 ms
more per call than ``->bhqv``, about 30 ms, for 16 MiB results: a quarter
of a strided copy's cost per byte), which the model leaves out.  The mtf lowering issues one
``tf.einsum`` per device with the labels of
:func:`mtf_core.ops._local.einsum_equation` (first appearance: inputs in
order, then the output) on slices whose dims keep the tensor's order, so what
is transposed follows from the op's shapes and the slices' sizes.

Such a transpose is a strided copy: on the CI host the weight gradient
``[1, 64, 4096] x [1, 64, 1024] -> [1024, 4096]`` took 2.1-2.4 times as long
with its output transposed as without (``bench/einsum_transposes.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["kernel_transposes", "moved_operands"]

_BATCH, _FREE, _CONTRACT, _REDUCE = 1, 2, 3, 4
# The order that uses the matmul's transpose flag instead (contract first).
_SWAPPED = {_BATCH: 1, _CONTRACT: 2, _FREE: 3, _REDUCE: 4}
_PLAIN = {t: t for t in _SWAPPED}


@functools.lru_cache(maxsize=4096)
def kernel_transposes(
    inputs: tuple[tuple[str, ...], ...], output: tuple[str, ...]
) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """What the kernel transposes for a two-input einsum with dim names
    ``inputs`` -> ``output``: ``(operand, permutation)`` pairs, the operand
    an input's index or ``len(inputs)`` for the output, the permutation the
    new order of its axes."""
    number: dict[str, int] = {}
    for names in list(inputs) + [output]:
        for n in names:
            number.setdefault(n, len(number))
    out = set(output)
    count: dict[str, int] = {}
    for names in inputs:
        for n in set(names):
            count[n] = count.get(n, 0) + 1
    types = {
        n: (_BATCH if n in out else _CONTRACT)
        if c > 1
        else (_FREE if n in out else _REDUCE)
        for n, c in count.items()
    }

    def key(n: str, rank: dict[int, int]) -> tuple[int, int]:
        return rank[types[n]], number[n]

    found = []
    for i, names in enumerate(inputs):
        if any(
            all(key(a, r) < key(b, r) for a, b in zip(names, names[1:]))
            for r in (_PLAIN, _SWAPPED)
        ):
            continue  # used as it lies
        found.append(
            (i, tuple(sorted(range(len(names)), key=lambda j: key(names[j], _PLAIN))))
        )
    # The matmul's result: batch labels, then each input's free labels.
    result = sorted(
        (n for n in number if types.get(n) == _BATCH), key=number.__getitem__
    )
    for names in inputs:
        result += sorted(
            (n for n in names if types[n] == _FREE), key=number.__getitem__
        )
    perm = tuple(result.index(n) for n in output)
    if perm != tuple(range(len(perm))):
        found.append((len(inputs), perm))
    return tuple(found)


def moved_operands(
    inputs: tuple[tuple[str, ...], ...],
    output: tuple[str, ...],
    sizes: Sequence[Sequence[int]],
) -> list[int]:
    """The operands (as in :func:`kernel_transposes`) whose transpose moves
    bytes, for slices of ``sizes`` (per input, then the output, each in its
    own dim order): dims larger than one change order."""
    moved = []
    for k, perm in kernel_transposes(inputs, output):
        if k < len(inputs):  # perm[i]: the input axis that goes to place i
            kept = [p for p in perm if sizes[k][p] > 1]
        else:  # perm[i]: the result axis that output axis i comes from
            kept = [p for i, p in enumerate(perm) if sizes[k][i] > 1]
        if kept != sorted(kept):
            moved.append(k)
    return moved

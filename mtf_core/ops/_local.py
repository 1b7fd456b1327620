"""Helpers for slice-local TensorFlow work inside op lowerings.

``tf`` is always passed in by the lowering (``lowering.tf``): mtf_core.ops never
imports TensorFlow itself.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

from mtf_core.shapes import Shape

_LETTERS = string.ascii_letters


def einsum_equation(input_shapes: Sequence[Shape], output_shape: Shape) -> str:
    """A tf.einsum equation over dimension names, one letter per name."""
    letters: dict[str, str] = {}
    for s in list(input_shapes) + [output_shape]:
        for d in s:
            if d.name not in letters:
                letters[d.name] = _LETTERS[len(letters)]
    ins = ",".join("".join(letters[d.name] for d in s) for s in input_shapes)
    return f"{ins}->{''.join(letters[d.name] for d in output_shape)}"


def align(tf: Any, x: Any, from_shape: Shape, to_shape: Shape) -> Any:
    """Transposes/reshapes a local slice of ``from_shape`` to broadcast against
    ``to_shape`` (every dim of ``from_shape`` must be in ``to_shape``)."""
    names = from_shape.dimension_names
    order = [n for n in to_shape.dimension_names if n in names]
    if order != names:
        x = tf.transpose(x, [names.index(n) for n in order])
    # Broadcasting aligns trailing axes, so a slice whose dims are a suffix of
    # ``to_shape`` (a scalar included) needs no reshape: one TF op (and its
    # shape constant) fewer per device.
    suffix = to_shape.dimension_names[len(to_shape) - len(order) :]
    if order != suffix:
        local = x.shape
        new_shape = []
        k = 0
        for n in to_shape.dimension_names:
            if n in names:
                new_shape.append(local[k])
                k += 1
            else:
                new_shape.append(1)
        x = tf.reshape(x, new_shape)
    return x


def tf_function(tf: Any, path: str) -> Any:
    """The TensorFlow function at ``path`` (e.g. ``"math.exp"``) under ``tf``."""
    obj = tf
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def take(tf: Any, s: Any, axis: int, start: int, length: int) -> Any:
    """``s[..., start:start+length, ...]`` along ``axis``."""
    begin = [0] * s.shape.rank
    size = [-1] * s.shape.rank
    begin[axis], size[axis] = start, length
    return tf.slice(s, begin, size)


def maybe_transpose(tf: Any, x: Any, perm: Sequence[int]) -> Any:
    """``tf.transpose(x, perm)``, or ``x`` itself when ``perm`` is the identity
    (one TF op fewer per device)."""
    perm = list(perm)
    return x if perm == list(range(len(perm))) else tf.transpose(x, perm)


def inverse_permutation(perm: Sequence[int]) -> list[int]:
    """The permutation that undoes ``perm``."""
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def block_ids(tf: Any, i: Any, c: Any, k: int) -> tuple[Any, Any]:
    """Ids relative to a device's block ``[c*k, (c+1)*k)`` of a split dim
    (``c``: the device's coordinate, an int or a scalar tensor), as int32 or
    int64, and whether each falls in the block."""
    if i.dtype not in (tf.int32, tf.int64):
        i = tf.cast(i, tf.int32)
    if not isinstance(c, int) or c:
        i = i - tf.cast(c * k, i.dtype)
    return i, tf.logical_and(i >= 0, i < k)


def masked_gather(tf: Any, w: Any, i: Any, c: Any, k: int, batch: int) -> Any:
    """Rows of ``w`` along axis ``batch`` (after ``batch`` leading dims shared
    with ``i``) for the ids ``i`` in this device's block ``[c*k, (c+1)*k)``;
    zeros for ids outside it (another device has those rows)."""
    ids, valid = block_ids(tf, i, c, k)
    g = tf.gather(
        w, tf.where(valid, ids, tf.zeros_like(ids)), axis=batch, batch_dims=batch
    )
    rest = g.shape.rank - valid.shape.rank
    if rest:
        valid = tf.reshape(valid, valid.shape.as_list() + [1] * rest)
    return tf.where(valid, g, tf.zeros([], g.dtype))

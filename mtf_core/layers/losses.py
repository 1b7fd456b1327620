"""Losses: softmax and sigmoid cross entropy, and the padding weights."""

from __future__ import annotations

from typing import Any

import numpy as np

from mtf_core import dtypes
from mtf_core.errors import ConfigError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.layers._dims import dim_in
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.creation import constant
from mtf_core.shapes import Dimension, Shape


def one_hot_by_compare(
    ids: Tensor, vocab: Dimension, on_value: float, off_value: float, dtype: Any
) -> Tensor:
    """``one_hot`` as a comparison with a ``[vocab]`` range: every op here
    splits over vocab, so a vocab-split layout needs no communication."""
    positions = constant(ids.mesh, np.arange(vocab.size), Shape([vocab]), ids.dtype)
    hit = ew.cast(ew.equal(ids, positions), dtype)
    if on_value == 1.0 and off_value == 0.0:
        return hit
    return hit * (on_value - off_value) + off_value


def softmax_cross_entropy_with_logits(
    logits: Tensor,
    targets: Tensor,
    vocab_dim: Any,
    z_loss: float = 0.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-example cross entropy over ``vocab_dim``.

    ``targets`` is a distribution with ``logits``' dims (e.g. ``one_hot``),
    or integer ids with the other dims (hard targets, as in Mesh TensorFlow).
    ``label_smoothing`` mixes the targets with the uniform distribution;
    ``z_loss`` adds ``z_loss * logsumexp(logits)^2``, which keeps the softmax
    normalizer near 1.
    """
    d = dim_in(logits, vocab_dim, "softmax_cross_entropy_with_logits")
    if targets.dtype in dtypes.INTEGER:
        if set(targets.shape.dims) != set(logits.shape.dims) - {d}:
            raise ShapeError(
                f"softmax_cross_entropy_with_logits: integer targets {targets.name} "
                f"[{targets.shape}] must have the dims of logits [{logits.shape}] "
                f"but {d.name!r}"
            )
        targets = one_hot_by_compare(targets, d, 1.0, 0.0, logits.dtype)
    if d.name not in targets.shape.dimension_names:
        raise ShapeError(
            f"softmax_cross_entropy_with_logits: targets {targets.name} "
            f"[{targets.shape}] have no vocab dimension {d.name!r}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ConfigError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if label_smoothing:
        targets = targets * (1.0 - label_smoothing) + label_smoothing / d.size
    lse = red.reduce_logsumexp(logits, reduced_dim=d)
    loss = lse - red.reduce_sum(logits * targets, reduced_dim=d)
    if z_loss:
        loss = loss + ew.square(lse) * z_loss
    return loss


def sparse_softmax_cross_entropy(
    logits: Tensor,
    target_ids: Tensor,
    vocab_dim: Any,
    z_loss: float = 0.0,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross entropy against integer targets (one-hot over ``vocab_dim``)."""
    d = dim_in(logits, vocab_dim, "sparse_softmax_cross_entropy")
    hot = one_hot_by_compare(target_ids, d, 1.0, 0.0, logits.dtype)
    return softmax_cross_entropy_with_logits(
        logits, hot, d, z_loss=z_loss, label_smoothing=label_smoothing
    )


def sigmoid_cross_entropy_with_logits(logits: Tensor, targets: Tensor) -> Tensor:
    """Elementwise ``-z log(sigmoid(x)) - (1-z) log(1-sigmoid(x))``, in the
    stable form ``relu(x) - x z + log(1 + exp(-|x|))``."""
    if logits.shape != targets.shape:
        raise ShapeError(
            f"sigmoid_cross_entropy_with_logits: logits [{logits.shape}] and "
            f"targets [{targets.shape}] must have one shape"
        )
    x, z = logits, targets
    return ew.relu(x) - x * z + ew.log(1.0 + ew.exp(ew.negative(ew.abs(x))))


def weights_nonzero(targets: Tensor, dtype: Any = "float32") -> Tensor:
    """1 where ``targets`` is not 0 (padding), else 0, in ``dtype``."""
    zero = constant(targets.mesh, 0, (), targets.dtype)
    return ew.cast(ew.not_equal(targets, zero), dtype)

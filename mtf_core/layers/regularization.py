"""Training aids from Mesh TensorFlow's ``mtf.layers``: dropout whose rate
anneals with the step, activation-gradient clipping and the activation
summaries.  All are mtf ops, so they lower under any layout."""

from __future__ import annotations

from typing import Any

from mtf_core import dtypes
from mtf_core.autodiff import custom_gradient
from mtf_core.errors import ArgumentError, ShapeError
from mtf_core.graph import Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.random import random_uniform
from mtf_core.shapes import convert_to_shape


def annealed_dropout(
    x: Tensor,
    is_training: bool,
    start_step: int,
    end_step: int,
    init_rate: float | None = None,
    noise_shape: Any = None,
    name: str | None = None,
) -> Tensor:
    """Dropout whose rate falls linearly from ``init_rate`` at ``start_step``
    to 0 at ``end_step`` of the graph's global step (the optimizers'
    counter); a rate below 0 is 0."""
    from mtf_core.optimize import global_step

    if init_rate is None or not 0.0 <= init_rate < 1.0:
        raise ArgumentError(
            f"annealed_dropout: init_rate {init_rate!r} must be in [0, 1)"
        )
    if end_step <= start_step:
        raise ArgumentError(
            f"annealed_dropout: end_step {end_step} must come after start_step "
            f"{start_step}"
        )
    if not is_training or init_rate == 0.0:
        return x
    shape = x.shape if noise_shape is None else convert_to_shape(noise_shape)
    for d in shape:
        if d not in x.shape.dims:
            raise ShapeError(
                f"annealed_dropout: noise_shape dimension {d} is not a dimension "
                f"of {x.name} [{x.shape}]"
            )
    step = ew.cast(global_step(x.mesh), "float32")
    done = (step - float(start_step)) / float(end_step - start_step)
    keep = ew.minimum((1.0 - init_rate) + done * init_rate, 1.0)
    floating = dtypes.is_floating(x.dtype)
    u = random_uniform(x.mesh, shape, name=name or "annealed_dropout_noise")
    mask = ew.cast(ew.less(u, keep), "float32")
    if floating:
        mask = mask / keep
    return x * ew.cast(mask, x.dtype)


def clip_activation_gradient(x: Tensor, clip_rms_norm: float | None = None) -> Tensor:
    """``x`` unchanged; its gradient is scaled down, when its root mean square
    exceeds ``clip_rms_norm``, to that RMS."""

    def grad_fn(output_grads: list[Tensor | None], **_: Any) -> list[Tensor | None]:
        (g,) = output_grads
        if g is None or not clip_rms_norm:
            return [g]
        rms = ew.sqrt(red.reduce_mean(ew.square(g)))
        return [g / ew.maximum(rms / float(clip_rms_norm), 1.0)]

    out: Tensor = custom_gradient(lambda t: ew.identity(t), grad_fn, [x])
    return out


def summary_for_clip_activation_gradient(
    t: Tensor, name: str | None = None, batch_dims: Any = None
) -> None:
    """Scalar summaries of ``t`` (Mesh TF's names): ``mean/`` and ``max/``,
    and with ``batch_dims`` the mean, max and variance of the per-example
    root mean square as ``rms_mean/<name>``, ``rms_max/<name>`` and
    ``rms_var/<name>``."""
    from mtf_core.ops.summary import scalar_summary

    scalar_summary("mean/", red.reduce_mean(t))
    scalar_summary("max/", red.reduce_max(t))
    if batch_dims:
        rms = ew.sqrt(
            red.reduce_mean(ew.square(t), output_shape=convert_to_shape(batch_dims))
        )
        mean = red.reduce_mean(rms)
        scalar_summary(f"rms_mean/{name}", mean)
        scalar_summary(f"rms_max/{name}", red.reduce_max(rms))
        scalar_summary(f"rms_var/{name}", red.reduce_mean(ew.square(rms - mean)))

"""A mixture-of-experts feed-forward layer (top-1 routing, GShard/Switch style).

Each token goes to the one expert its router scores highest, up to
``capacity = ceil(capacity_factor * length / experts)`` tokens per expert and
sequence (the rest are dropped: they pass through the residual only).  Named
dims make the layout a rule: the router works over ``routed_experts`` next to
``batch``; the experts' inputs are renamed to ``[group, experts, ...]`` so that
``batch:dp;experts:dp`` (experts over the data axis) is a valid layout, and the
rename is the all-to-all that sends each token to its expert's device (and
back after the experts).  The gate value scales the expert's output, so the
router learns; no load-balancing loss is added.
"""

from __future__ import annotations

import math
from typing import Any

from mtf_core.graph import Tensor
from mtf_core.layers.initializers import normal_initializer
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.cumsum import cumsum
from mtf_core.ops.einsum import einsum
from mtf_core.ops.indexing import one_hot
from mtf_core.ops.reshape import reshape
from mtf_core.ops.top_k import argmax
from mtf_core.ops.variables import get_variable
from mtf_core.shapes import Dimension, Shape


def moe_feed_forward(
    x: Tensor,
    num_experts: int,
    d_ff: Dimension,
    capacity_factor: float,
    variable_dtype: Any,
    activation: Any = ew.relu,
    name: str = "moe",
) -> Tensor:
    """``x [batch, length, d_model]`` through a top-1 mixture of experts."""
    batch, length, d_model = x.shape.dims
    routed = Dimension("routed_experts", num_experts)
    experts = Dimension("experts", num_experts)
    cap = Dimension(
        "expert_capacity",
        max(1, math.ceil(capacity_factor * length.size / num_experts)),
    )
    group = Dimension("group", batch.size)

    def weight(suffix: str, shape: list[Dimension], fan_in: int) -> Tensor:
        w = f"{name}_{suffix}"
        return get_variable(
            x.mesh,
            w,
            Shape(shape),
            variable_dtype,
            initializer=normal_initializer(fan_in**-0.5, w),
        )

    gate_w = weight("gate", [d_model, routed], d_model.size)
    logits = einsum([x, gate_w], output_shape=Shape([batch, length, routed]))
    probs = red.softmax(ew.cast(logits, "float32"), routed)
    choice = one_hot(argmax(probs, routed), routed, dtype="float32")
    gate = red.reduce_sum(probs * choice, reduced_dim=routed)  # [batch, length]
    # A token's place in its expert's queue; places past capacity are dropped
    # (one_hot of an out-of-range index is a zero row).
    place = red.reduce_sum(
        cumsum(choice, length, exclusive=True) * choice, reduced_dim=routed
    )
    slot = one_hot(ew.cast(place, "int32"), cap, dtype="float32")
    dispatch = ew.stop_gradient(
        einsum([choice, slot], output_shape=Shape([batch, length, routed, cap]))
    )
    combine = einsum([dispatch, gate], output_shape=dispatch.shape)
    act = x.dtype
    routed_in = einsum(
        [x, ew.cast(dispatch, act)], output_shape=Shape([batch, routed, cap, d_model])
    )
    # The all-to-all: tokens move from their batch's device to their expert's.
    expert_in = reshape(routed_in, Shape([group, experts, cap, d_model]))
    wi = weight("wi", [experts, d_model, d_ff], d_model.size)
    wo = weight("wo", [experts, d_ff, d_model], d_ff.size)
    h = activation(
        einsum([expert_in, wi], output_shape=Shape([group, experts, cap, d_ff]))
    )
    expert_out = einsum([h, wo], output_shape=Shape([group, experts, cap, d_model]))
    routed_out = reshape(expert_out, routed_in.shape)  # and back
    return einsum(
        [routed_out, ew.cast(combine, act)],
        output_shape=Shape([batch, length, d_model]),
    )

"""Layers built from mtf ops (Mesh TensorFlow's ``mtf.layers``).

Every layer is plain mtf ops over named dims, so it lowers under any layout;
which dims get split is the layout's business, not the layer's.  Weights are
mtf variables with deterministic initializers (seeded by the variable's name),
so a model starts from the same values whatever mesh it is laid out on.

>>> import mtf_core as mtf
>>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
>>> x = mtf.zeros(mesh, "batch:2,d_model:4")
>>> str(mtf.layers.dense(x, new_dims="d_ff:8", name="ff").shape)
'batch:2,d_ff:8'

The family modules: :mod:`.dense`, :mod:`.norms`, :mod:`.attention`,
:mod:`.conv`, :mod:`.losses`, :mod:`.embedding`, :mod:`.initializers`; how
weights are named: :mod:`.scopes`.
"""

from __future__ import annotations

from mtf_core.layers.attention import (
    attention_bias_causal,
    attention_bias_local_block,
    attention_bias_padding,
    attention_mask_autoregressive,
    attention_mask_ignore_padding,
    attention_mask_same_segment,
    dot_product_attention,
    masked_local_attention_1d,
    multihead_attention,
    multihead_attention_params,
    multihead_attention_vars,
    multiplicative_jitter,
    rename_length_to_memory_length,
)
from mtf_core.layers.attention_blocks import (
    local_self_attention_spatial_blocks,
    multihead_self_attention_memory_compressed,
)
from mtf_core.layers.attention_steps import (
    compress_mean,
    local_1d_halo_exchange,
    local_2d_halo_exchange,
    masked_local_attention_1d_incremental,
    multihead_encdec_attention_incremental,
    multihead_self_attention_incremental,
)
from mtf_core.layers.conv import (
    conv1d,
    conv2d,
    conv2d_transpose,
    conv2d_transpose_with_blocks,
    conv2d_with_blocks,
    conv3d,
    conv3d_transpose,
    conv3d_transpose_with_blocks,
    conv3d_with_blocks,
    separable_conv1d,
)
from mtf_core.layers.dense import (
    dense,
    dense_product,
    dense_relu_dense,
    get_dense_kernel_weights,
    us_einsum,
)
from mtf_core.layers.embedding import dropout, embedding, embedding_weights
from mtf_core.layers.initializers import (
    DenseInitializer,
    RandomInitializer,
    VarianceScalingInitializer,
    normal_initializer,
    set_initializer_provider,
    unit_scaling_convention,
)
from mtf_core.layers.losses import (
    sigmoid_cross_entropy_with_logits,
    softmax_cross_entropy_with_logits,
    sparse_softmax_cross_entropy,
    weights_nonzero,
)
from mtf_core.layers.norms import batch_norm, corr, layer_norm, rms_norm
from mtf_core.layers.pooling import avg_pool2d, avg_pool3d, max_pool2d, max_pool3d
from mtf_core.layers.regularization import (
    annealed_dropout,
    clip_activation_gradient,
    summary_for_clip_activation_gradient,
)
from mtf_core.layers.reversible import reversible_half_residual_and_swap

__all__ = [
    "compress_mean",
    "local_1d_halo_exchange",
    "local_2d_halo_exchange",
    "local_self_attention_spatial_blocks",
    "masked_local_attention_1d_incremental",
    "multihead_encdec_attention_incremental",
    "multihead_self_attention_memory_compressed",
    "multihead_self_attention_incremental",
    "annealed_dropout",
    "clip_activation_gradient",
    "reversible_half_residual_and_swap",
    "summary_for_clip_activation_gradient",
    "DenseInitializer",
    "RandomInitializer",
    "VarianceScalingInitializer",
    "attention_bias_causal",
    "attention_bias_local_block",
    "attention_bias_padding",
    "attention_mask_autoregressive",
    "attention_mask_ignore_padding",
    "attention_mask_same_segment",
    "avg_pool2d",
    "avg_pool3d",
    "batch_norm",
    "conv1d",
    "conv2d",
    "conv2d_transpose",
    "conv2d_transpose_with_blocks",
    "conv2d_with_blocks",
    "conv3d_transpose",
    "conv3d_transpose_with_blocks",
    "conv3d",
    "conv3d_with_blocks",
    "corr",
    "dense",
    "dense_product",
    "dense_relu_dense",
    "dot_product_attention",
    "dropout",
    "embedding",
    "embedding_weights",
    "get_dense_kernel_weights",
    "layer_norm",
    "masked_local_attention_1d",
    "max_pool2d",
    "max_pool3d",
    "multihead_attention",
    "multihead_attention_params",
    "multihead_attention_vars",
    "multiplicative_jitter",
    "normal_initializer",
    "rename_length_to_memory_length",
    "rms_norm",
    "set_initializer_provider",
    "separable_conv1d",
    "sigmoid_cross_entropy_with_logits",
    "softmax_cross_entropy_with_logits",
    "sparse_softmax_cross_entropy",
    "unit_scaling_convention",
    "us_einsum",
    "weights_nonzero",
]

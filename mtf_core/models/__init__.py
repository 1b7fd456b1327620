"""Ready-made models over named dims: Transformer LM, encoder-decoder, MLP,
and Mesh TensorFlow's README network for 8x8 digits (``build_mnist``).

Each builder returns a :class:`~mtf_core.models.base.ModelGraph`: the graph,
its placeholders, the loss and (for training) the gradients and optimizer
updates, ready for ``mtf.compile_function``.
"""

from mtf_core.models.base import ModelGraph
from mtf_core.models.mlp import MlpConfig, build_mlp_classifier
from mtf_core.models.mnist import MnistModel, build_mnist
from mtf_core.models.transformer import (
    TransformerConfig,
    build_encoder_decoder,
    build_lm,
)

__all__ = [
    "MlpConfig",
    "MnistModel",
    "ModelGraph",
    "TransformerConfig",
    "build_encoder_decoder",
    "build_lm",
    "build_mlp_classifier",
    "build_mnist",
]

"""Example models as graph documents, for ``mtf-planner export`` and seeding.

Graphs are built with mtf_core's graph construction only (no lowering, so no
TensorFlow): the models in :mod:`mtf_core.models` (``mnist`` is the network
``examples/mnist.py`` trains).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtf_core.errors import ConfigError
from mtf_core.models import (
    MlpConfig,
    TransformerConfig,
    build_encoder_decoder,
    build_lm,
    build_mlp_classifier,
    build_mnist,
)
from mtf_core.serialization import graph_to_dict

_TRANSFORMER_FIELDS = {
    "layers": "num_layers",
    "d_model": "d_model",
    "heads": "heads",
    "d_kv": "d_kv",
    "d_ff": "d_ff",
    "vocab": "vocab",
    "length": "length",
    "batch": "batch",
}
_MLP_FIELDS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden",
    "batch": "batch",
    "features": "features",
    "classes": "classes",
}


def _pick(fields: dict[str, str], sizes: dict[str, Any], model: str) -> dict[str, Any]:
    unknown = sorted(k for k, v in sizes.items() if v is not None and k not in fields)
    if unknown:
        raise ConfigError(
            f"model {model!r} has no size(s) {unknown}; it takes {sorted(fields)}"
        )
    return {fields[k]: v for k, v in sizes.items() if v is not None}


def _transformer(build: Callable[..., Any]) -> Callable[..., tuple[Any, list[Any]]]:
    def make(
        optimizer: str, sizes: dict[str, Any], model: str
    ) -> tuple[Any, list[Any]]:
        cfg = TransformerConfig(**_pick(_TRANSFORMER_FIELDS, sizes, model))
        m = build(cfg, optimizer=optimizer)
        return m.graph, [m.loss]

    return make


def _mlp(optimizer: str, sizes: dict[str, Any], model: str) -> tuple[Any, list[Any]]:
    m = build_mlp_classifier(
        MlpConfig(**_pick(_MLP_FIELDS, sizes, model)), optimizer=optimizer
    )
    return m.graph, [m.loss]


def _mnist(optimizer: str, sizes: dict[str, Any], model: str) -> tuple[Any, list[Any]]:
    picked = _pick({"batch": "batch_size", "hidden": "hidden_size"}, sizes, model)
    picked.setdefault("batch_size", 64)
    m = build_mnist(**picked)
    return m.graph, [m.loss]


#: name -> builder(optimizer, sizes, name) -> (graph, outputs)
MODELS: dict[str, Callable[[str, dict[str, Any], str], tuple[Any, list[Any]]]] = {
    "transformer-lm": _transformer(build_lm),
    "encoder-decoder": _transformer(build_encoder_decoder),
    "mlp": _mlp,
    "mnist": _mnist,
}


def example_graph(model: str, optimizer: str = "adam", **sizes: Any) -> dict[str, Any]:
    """The graph document of example ``model`` (a training step: loss,
    gradients, optimizer updates) with the given sizes (None: default).

    >>> doc = example_graph("mlp", layers=1, hidden=8)
    >>> doc["format"], doc["metadata"]["name"]
    ('mtf-graph', 'mlp')
    """
    if model not in MODELS:
        raise ConfigError(f"unknown model {model!r}; expected one of {sorted(MODELS)}")
    graph, outputs = MODELS[model](optimizer, sizes, model)
    meta = {"name": model, "optimizer": optimizer}
    if model == "mnist":
        meta["optimizer"] = "sgd with momentum (mtf_core.models.mnist)"
    meta.update({k: v for k, v in sizes.items() if v is not None})
    return graph_to_dict(graph, outputs=outputs, metadata=meta)

"""An MLP classifier over named dims ``batch, features, hidden, classes``."""

from __future__ import annotations

from dataclasses import dataclass

from mtf_core import layers
from mtf_core.graph import Graph, Mesh
from mtf_core.models.base import ModelGraph, add_training, positive_int
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.creation import placeholder
from mtf_core.optimize import Optimizer
from mtf_core.shapes import Dimension


@dataclass(frozen=True)
class MlpConfig:
    """``num_hidden_layers`` relu layers of width ``hidden``, then a softmax."""

    batch: int = 8
    features: int = 16
    hidden: int = 32
    classes: int = 4
    num_hidden_layers: int = 2

    def __post_init__(self) -> None:
        for f in ("batch", "features", "hidden", "classes", "num_hidden_layers"):
            object.__setattr__(
                self, f, positive_int(f"MlpConfig.{f}", getattr(self, f))
            )


def build_mlp_classifier(
    config: MlpConfig,
    optimizer: Optimizer | str | None = None,
    learning_rate: float | None = None,
    graph: Graph | None = None,
) -> ModelGraph:
    """Placeholders ``features [batch, features]`` (float32) and ``labels
    [batch]`` (int32 class ids); the loss is mean softmax cross entropy."""
    graph = graph if graph is not None else Graph()
    mesh = Mesh(graph, "mesh")
    batch = Dimension("batch", config.batch)
    feats = Dimension("features", config.features)
    classes = Dimension("classes", config.classes)
    ph = {
        "features": placeholder(mesh, [batch, feats], "float32", name="features"),
        "labels": placeholder(mesh, [batch], "int32", name="labels"),
    }
    x = ph["features"]
    for i in range(config.num_hidden_layers):
        # Alternate two names so consecutive layers' weights can be split
        # differently (hidden_0 -> hidden_1 is a [hidden_0, hidden_1] matrix).
        h = Dimension(f"hidden_{i % 2}", config.hidden)
        x = layers.dense(x, h, activation=ew.relu, name=f"hidden_{i}")
    logits = layers.dense(x, classes, name="logits")
    loss = red.reduce_mean(
        layers.sparse_softmax_cross_entropy(logits, ph["labels"], classes)
    )
    model = ModelGraph(graph, mesh, ph, loss, logits, config)
    return add_training(model, optimizer, learning_rate)

"""What every model builder returns, and the training-graph tail they share."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

from mtf_core.errors import ConfigError
from mtf_core.graph import Graph, Mesh, Tensor
from mtf_core.ops.variables import Assign
from mtf_core.optimize import Optimizer, make_optimizer, training_gradients


@dataclass
class ModelGraph:
    """A built model: placeholders in, loss (and logits) out, updates to apply.

    Attributes:
      graph, mesh: the mtf graph and its one mesh.
      inputs: placeholders by name, in the order a compiled step takes them.
      loss: the scalar training loss.
      logits: the model's output logits (for inference).
      grads: one gradient per trainable variable (empty when not training).
      updates: optimizer assignments (empty when not training).
      config: the config the model was built from.
    """

    graph: Graph
    mesh: Mesh
    inputs: dict[str, Tensor]
    loss: Tensor
    logits: Tensor
    config: Any
    grads: list[Tensor | None] = field(default_factory=list)
    updates: list[Assign] = field(default_factory=list)

    @property
    def placeholders(self) -> list[Tensor]:
        return list(self.inputs.values())

    @property
    def num_parameters(self) -> int:
        return sum(v.outputs[0].size for v in self.graph.trainable_variables)


def add_training(
    model: ModelGraph, optimizer: Optimizer | str | None, learning_rate: float | None
) -> ModelGraph:
    """Adds gradients of the loss and the optimizer's updates to ``model``."""
    if optimizer is None:
        return model
    opt = (
        make_optimizer(optimizer, learning_rate)
        if isinstance(optimizer, str)
        else optimizer
    )
    variables = list(model.graph.trainable_variables)
    # Of the values; of the reads for weights updated under slot names.
    model.grads = training_gradients([model.loss], variables)
    model.updates = opt.apply_grads(model.grads, variables)
    return model


def positive_int(name: str, v: Any) -> int:
    """``v`` as an ``int`` (a numpy integer too); a bool, a non-integer or a
    value below 1 is a ConfigError naming ``name`` (a model config's field)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ConfigError(f"{name} must be a positive integer, got {v!r}")
    return int(v)

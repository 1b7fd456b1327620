"""What both compiled-step backends share: :class:`CompiledStep`, the base of
:class:`~compiled.CompiledFunction` (placement) and
:class:`~spmd_compiled.SpmdCompiledFunction` (SPMD).  Neither backend imports
the other; :mod:`steps` chooses between them."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import LoweringError, ShapeError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.lowering.counters import Counters
from mtf_core.lowering.variables import VariableStore
from mtf_core.ops.creation import ImportTensor, fed_value


class CompiledStep(abc.ABC):
    """``step(*placeholder_values) -> [output values]``, updates applied in place.

    Attributes:
      graph, mesh_to_impl: what was compiled, on which backends.
      inputs: the placeholders the step takes, in call order.
      outputs: the tensors it returns; updates: the assignments it applies.
      variables: the VariableStore (export/import full values for checkpoints).
      counters: the collectives and flops recorded when the step was traced
        (None before).
      random_step: the calls made so far, which seed the step's random ops
        (dropout, sampling); set it when resuming from a checkpoint.
    """

    def __init__(
        self,
        graph: Graph,
        mesh_to_impl: Mapping[Mesh, Any],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        updates: Sequence[Operation],
        variables: VariableStore | None,
    ) -> None:
        self.graph = graph
        self.mesh_to_impl: dict[Mesh, Any] = dict(mesh_to_impl)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.updates = list(updates)
        for t in self.inputs:
            if not (
                isinstance(t.operation, ImportTensor) and t.operation.is_placeholder
            ):
                raise LoweringError(
                    f"input {t.name} is not a placeholder (mtf.placeholder)"
                )
        self.variables = (
            variables
            if variables is not None
            else VariableStore(graph, self.mesh_to_impl)
        )
        self.counters: Counters | None = None
        # Each call adds one and seeds the random ops with the result (made
        # here, not while tracing: a variable made then makes TF trace twice).
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="mtf_step")

    @property
    def random_step(self) -> int:
        """The calls made so far: the next call draws its random numbers
        (dropout masks, samples) with seed ``random_step + 1``."""
        return int(self._step.numpy())

    @random_step.setter
    def random_step(self, value: int) -> None:
        # A checkpoint holds the variables but not this counter: a step resumed
        # at step n under another layout sets it to n, so its dropout masks
        # are the ones the uninterrupted run drew.
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise LoweringError(f"random_step {value!r} is not an integer")
        if value < 0:
            raise LoweringError(f"random_step {value} is negative; expected >= 0")
        self._step.assign(int(value))

    def check_arity(self, values: Sequence[Any]) -> None:
        """Raises unless ``values`` has one value per input placeholder."""
        if len(values) != len(self.inputs):
            raise LoweringError(
                f"compiled function takes {len(self.inputs)} inputs "
                f"({[t.name for t in self.inputs]}), got {len(values)}"
            )

    def checked_inputs(self, values: Sequence[Any]) -> list[Any]:
        """``values`` as tensors of their placeholders' dtypes, after checking
        their number, shapes and numbers (an integer placeholder takes whole
        numbers that fit it: :func:`~mtf_core.ops.creation.fed_value`), as
        both backends check them."""
        self.check_arity(values)
        out = []
        for v, t in zip(values, self.inputs):
            try:
                out.append(fed_value(tf, v, t, f"input {t.name}"))
            except ShapeError as e:
                raise LoweringError(str(e)) from None
        return out

    @abc.abstractmethod
    def trace(self) -> float:
        """Traces (lowers) the step now, once; returns the seconds it took."""

    @abc.abstractmethod
    def __call__(self, *values: Any) -> list[np.ndarray]:
        """Runs one step on ``values`` (one per input); returns the outputs."""

"""Training loop and sampling for the ready-made models (imports TensorFlow).

:class:`Trainer` compiles a model's training step for a mesh and layout, runs
it, and saves / restores full variable values, so a run can resume on another
mesh or layout.  :func:`generate` samples from a trained LM.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from mtf_core.errors import ConfigError, LoweringError
from mtf_core.lowering.devices import logical_cpu_devices
from mtf_core.lowering.placement import PlacementMeshImpl
from mtf_core.lowering.step_common import CompiledStep
from mtf_core.lowering.steps import compile_function
from mtf_core.models.base import ModelGraph
from mtf_core.optimize import STEP_NAME
from mtf_core.presets import LayoutChoice
from mtf_core.train.checkpoint import Checkpoint, save_checkpoint


def mesh_impl_for(choice: LayoutChoice, devices: Sequence[str] | None = None) -> Any:
    """A placement mesh implementation on the first ``mesh size`` logical CPUs."""
    n = choice.mesh_shape.size
    devices = list(devices) if devices is not None else logical_cpu_devices(n)
    if len(devices) < n:
        raise ConfigError(
            f"mesh [{choice.mesh_shape}] needs {n} devices, only {len(devices)} given"
        )
    return PlacementMeshImpl(choice.mesh_shape, choice.rules, devices[:n])


@dataclass
class StepResult:
    step: int
    loss: float
    seconds: float


class Trainer:
    """Runs a model's training step on one mesh and layout.

    >>> # trainer = Trainer(build_lm(cfg, "adam"), resolve_layout("2d", 8))
    >>> # loss = trainer.step(batch)          # batch: {"inputs": ..., "targets": ...}
    """

    def __init__(
        self,
        model: ModelGraph,
        layout: LayoutChoice,
        devices: Sequence[str] | None = None,
    ) -> None:
        if not model.updates:
            raise ConfigError("Trainer needs a model built with an optimizer")
        self.model = model
        self.layout = layout
        self.impl = mesh_impl_for(layout, devices)
        self.fn: CompiledStep = compile_function(
            model.graph,
            {model.mesh: self.impl},
            inputs=model.placeholders,
            outputs=[model.loss],
            updates=model.updates,
        )
        self._eval: CompiledStep | None = None
        steps = [v for v in model.graph.all_variables if v.name == STEP_NAME]
        self._step_var = steps[0] if steps else None
        self.global_step = self._read_step()

    def _read_step(self) -> int:
        """The optimizer's step counter (restored with a checkpoint)."""
        if self._step_var is None:
            return 0
        return int(self.fn.variables.export(self._step_var))

    def _args(self, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        missing = [n for n in self.model.inputs if n not in batch]
        if missing:
            raise ConfigError(
                f"batch lacks {missing}; the model takes {list(self.model.inputs)}"
            )
        return [np.asarray(batch[n]) for n in self.model.inputs]

    def trace(self) -> float:
        """Lowers the step now (otherwise the first step does); returns seconds."""
        return self.fn.trace()

    def step(self, batch: Mapping[str, np.ndarray]) -> float:
        """One training step; returns the loss *before* the update."""
        loss = float(self.fn(*self._args(batch))[0])
        self.global_step += 1
        return loss

    def evaluate(self, batch: Mapping[str, np.ndarray]) -> float:
        """The loss on ``batch`` without updating anything."""
        if self._eval is None:
            self._eval = compile_function(
                self.model.graph,
                {self.model.mesh: self.impl},
                inputs=self.model.placeholders,
                outputs=[self.model.loss],
                variables=self.fn.variables,
            )
        return float(self._eval(*self._args(batch))[0])

    def run(
        self, batches: Iterator[Mapping[str, np.ndarray]], steps: int
    ) -> Iterator[StepResult]:
        """Yields one :class:`StepResult` per step for ``steps`` steps."""
        for _ in range(steps):
            batch = next(batches)
            t0 = time.perf_counter()
            loss = self.step(batch)
            yield StepResult(self.global_step, loss, time.perf_counter() - t0)

    # -- checkpoints ----------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Full values of every variable (parameters, slots, step)."""
        return self.fn.variables.to_dict()

    def load_state(self, values: Mapping[str, np.ndarray]) -> None:
        self.fn.variables.load_dict(dict(values), strict=True)
        self.global_step = self._read_step()
        if self._step_var is not None:
            # The step number seeds dropout: the next step draws the masks the
            # uninterrupted run drew at this step.
            self.fn.random_step = self.global_step

    def save(self, directory: str, metadata: dict[str, Any], keep: int = 3) -> str:
        meta = {
            "mesh_shape": str(self.layout.mesh_shape),
            "layout": str(self.layout.rules),
            **metadata,
        }
        return str(
            save_checkpoint(directory, self.global_step, self.state(), meta, keep)
        )

    def restore(self, checkpoint: Checkpoint) -> None:
        self.load_state(checkpoint.values)


def summary_writer(logdir: str | None) -> Any:
    """A TensorBoard writer for ``logdir`` (None: a writer that does nothing)."""
    if not logdir:
        return None
    return tf.summary.create_file_writer(logdir)


def write_scalars(writer: Any, step: int, scalars: Mapping[str, float]) -> None:
    if writer is None:
        return
    with writer.as_default():
        for name, value in scalars.items():
            tf.summary.scalar(name, value, step=step)
    writer.flush()


# --------------------------------------------------------------------------
# inference
# --------------------------------------------------------------------------


class LMSampler:
    """Greedy or temperature sampling from a decoder-only LM.

    Each new token reruns the model on the last ``length`` tokens (no key/value
    cache): simple, and exact for a causal model.
    """

    def __init__(
        self,
        model: ModelGraph,
        values: Mapping[str, np.ndarray],
        layout: LayoutChoice,
        devices: Sequence[str] | None = None,
    ) -> None:
        if "inputs" not in model.inputs:
            raise ConfigError("sampling needs a language model with an 'inputs' input")
        self.model = model
        self.length = model.inputs["inputs"].shape.to_integer_list()[1]
        self.batch = model.inputs["inputs"].shape.to_integer_list()[0]
        impl = mesh_impl_for(layout, devices)
        self.fn = compile_function(
            model.graph,
            {model.mesh: impl},
            inputs=[model.inputs["inputs"]],
            outputs=[model.logits],
        )
        names = {v.name for v in model.graph.all_variables}
        missing = sorted(names - set(values))
        if missing:
            raise LoweringError(f"checkpoint lacks model variables {missing[:5]}")
        self.fn.variables.load_dict(
            {k: v for k, v in values.items() if k in names}, strict=True
        )

    def next_logits(self, contexts: np.ndarray, positions: np.ndarray) -> np.ndarray:
        (logits,) = self.fn(contexts.astype(np.int32))
        picked: np.ndarray = logits[np.arange(self.batch), positions]
        return picked

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int = 0,
    ) -> list[list[int]]:
        """Continues each prompt by ``max_new_tokens`` ids.  ``temperature`` 0
        is greedy (argmax); otherwise ids are drawn from softmax(logits / T)."""
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature!r}")
        if len(prompts) != self.batch:
            raise ConfigError(
                f"{len(prompts)} prompts given; this sampler's batch is {self.batch}"
            )
        if any(len(p) == 0 for p in prompts):
            raise ConfigError("every prompt needs at least one token")
        rng = np.random.default_rng(seed)
        seqs = [list(map(int, p)) for p in prompts]
        for _ in range(max_new_tokens):
            ctx = np.zeros((self.batch, self.length), np.int32)
            pos = np.zeros(self.batch, np.int64)
            for i, s in enumerate(seqs):
                window = s[-self.length :]
                ctx[i, : len(window)] = window
                pos[i] = len(window) - 1
            logits = self.next_logits(ctx, pos).astype(np.float64)
            if temperature == 0.0:
                nxt = logits.argmax(axis=-1)
            else:
                z = logits / temperature
                p = np.exp(z - z.max(axis=-1, keepdims=True))
                p /= p.sum(axis=-1, keepdims=True)
                nxt = np.array([rng.choice(len(row), p=row) for row in p])
            for s, t in zip(seqs, nxt):
                s.append(int(t))
        return seqs

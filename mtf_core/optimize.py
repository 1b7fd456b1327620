"""Optimizers that update mtf variables with mtf ops.

Every optimizer turns ``(gradient, variable)`` pairs into :class:`~mtf_core.ops.
variables.Assign` operations.  Slot variables (momentum, Adam's moments,
Adafactor's factored second moments) and the step counter are mtf variables
themselves, so they are laid out by the layout rules, saved in checkpoints and
counted in memory exactly like the parameters they belong to.

>>> # grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
>>> # updates = mtf.optimize.AdamWeightDecayOptimizer(1e-3).apply_grads(
>>> #     grads, graph.trainable_variables)

Optimizer slots only sharding (ZeRO-1, Megatron-LM's distributed optimizer):
a variable that ``get_variable`` made under :func:`mtf_core.ops.stored.
slot_names` is updated under its slot names.  :func:`training_gradients`
differentiates such a variable's *read* (the value the model computes with,
its gradient still a pending sum over the data axis), and ``apply_grads``

* reduce-scatters that gradient into the slot names (``ReduceScatter``; cast
  to the variable's dtype after),
* keeps the slots under the slot names (a shard each when they are split),
* updates the variable's value renamed to the slot names (a local slice of
  the whole value), and
* renames the updated shard back to the variable's names for the assignment
  (an allgather over the axis that splits the slot name).

Under layout rules that leave the slot names whole the chain is a plain
update: the gradient's sum is forced whole (an allreduce) and the renames are
free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mtf_core.autodiff import gradients
from mtf_core.errors import ConfigError, GraphError
from mtf_core.graph import Graph, Mesh, Tensor
from mtf_core.ops import elementwise as ew
from mtf_core.ops import reduce as red
from mtf_core.ops.creation import constant
from mtf_core.ops.reshape import reshape
from mtf_core.ops.stored import ReduceScatter, SlotSharding, slot_sharding
from mtf_core.ops.variables import Assign, Variable, as_variable, assign, get_variable
from mtf_core.shapes import Dimension, Shape

STEP_NAME = "global_step"


def _zeros(shape: Sequence[int], dtype: Any) -> np.ndarray:
    return np.zeros(list(shape), dtype=str(getattr(dtype, "name", dtype)))


def global_step(mesh: Mesh, name: str = STEP_NAME) -> Tensor:
    """The graph's int32 step counter (created on first use, starts at 0).

    Optimizers increment it once per :meth:`Optimizer.apply_grads`; it is an
    ordinary (non-trainable) mtf variable, so checkpoints carry it.  ``name``:
    another counter (a pipeline stage's, kept on the stage's mesh).
    """
    for v in mesh.graph.all_variables:
        if v.name == name:
            return v.outputs[0]
    return get_variable(
        mesh, name, Shape([]), "int32", initializer=_zeros, trainable=False
    )


def _check_positive(what: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(f"{what} must be a positive number, got {value!r}")


def _check_unit(what: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0.0 <= value < 1.0):
        raise ConfigError(f"{what} must be in [0, 1), got {value!r}")


def _scalar(mesh: Mesh, x: Any) -> Tensor:
    if isinstance(x, Tensor):
        if x.shape.ndims:
            raise GraphError(
                f"learning rate {x.name} has shape [{x.shape}]; expected a scalar"
            )
        return x
    return constant(mesh, float(x), (), "float32")


class Optimizer:
    """Base class: ``apply_grads(grads, variables) -> [Assign, ...]``.

    ``variables`` are :class:`Variable` ops or their value tensors; a ``None``
    gradient (an unconnected variable) is skipped.
    """

    def __init__(self, learning_rate: Any) -> None:
        if not isinstance(learning_rate, Tensor):
            _check_positive("learning_rate", learning_rate)
        self.learning_rate = learning_rate
        self.step: Tensor | None = None  # global step *before* this update

    def apply_grads(
        self,
        grads: Sequence[Tensor | None],
        variables: Sequence[Any],
        step_name: str = STEP_NAME,
    ) -> list[Assign]:
        variables = [as_variable(v) for v in variables]
        if len(grads) != len(variables):
            raise GraphError(
                f"apply_grads got {len(grads)} gradients for {len(variables)} variables"
            )
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        if not pairs:
            raise GraphError("apply_grads: every gradient is None; nothing to train")
        self._sharded: dict[Variable, SlotSharding] = {}
        for g, v in pairs:
            sharding = slot_sharding(v.graph, v.name)
            read_shape = sharding.reads[0].shape if sharding is not None else None
            if sharding is not None and g.shape == read_shape:
                self._sharded[v] = sharding  # the read's gradient: ZeRO-1
            elif g.shape != v.shape:
                raise GraphError(
                    f"gradient {g.name} has shape [{g.shape}] but variable {v.name} "
                    f"has shape [{v.shape}]"
                    + (f" (or its read's, [{read_shape}])" if read_shape else "")
                )
        mesh = pairs[0][1].mesh
        self.step = global_step(mesh, step_name)
        self._consts: dict[tuple[str, float], Tensor] = {}
        self._lr: Tensor | None = None
        updates: list[Assign] = []
        for g, v in pairs:
            sharding = self._sharded.get(v)
            if sharding is not None:
                # The pending sum of the read's gradient, reduce-scattered
                # into the slot names, then in the variable's dtype.
                g = ReduceScatter(g, sharding.slot_shape).outputs[0]
                if g.dtype != v.dtype:
                    g = ew.cast(g, v.dtype)
            updates.extend(self.apply_grad(g, v))
        one = constant(mesh, 1, (), "int32")
        updates.append(assign(self.step, self.step + one, name="increment_step"))
        return updates

    def apply_grad(self, grad: Tensor, var: Variable) -> list[Assign]:
        raise NotImplementedError

    # -- the variable as the update sees it (a shard under slot names) --------
    def var_shape(self, var: Variable) -> Shape:
        """The shape the update works in: the variable's, or its slot shape."""
        table: dict[Variable, SlotSharding] = getattr(self, "_sharded", {})
        sharding = table.get(var)
        return var.shape if sharding is None else sharding.slot_shape

    def value(self, var: Variable) -> Tensor:
        """The variable's value in :meth:`var_shape` (renamed: a local slice
        of the whole value when the slot names are split)."""
        v = var.outputs[0]
        shape = self.var_shape(var)
        return v if shape == var.shape else reshape(v, shape, name=f"{var.name}/shard")

    def update(self, var: Variable, new_value: Tensor) -> Assign:
        """Assigns ``new_value`` (in :meth:`var_shape`) to ``var``, renamed
        back to its names (an allgather when the slot names are split)."""
        if new_value.shape != var.shape:
            new_value = reshape(new_value, var.shape, name=f"{var.name}/gather")
        return assign(var, new_value)

    # -- helpers --------------------------------------------------------------
    def const(self, mesh: Mesh, value: float) -> Tensor:
        """A float32 scalar constant, made once per ``apply_grads`` call (each
        Python float in an expression would otherwise add a Constant op)."""
        key = ("float32", float(value))
        t = self._consts.get(key)
        if t is None:
            t = self._consts[key] = constant(mesh, float(value), (), "float32")
        return t

    def lr(self, mesh: Mesh) -> Tensor:
        """The learning rate for this update (computed once per apply_grads)."""
        if self._lr is None:
            self._lr = self.make_lr(mesh)
        return self._lr

    def make_lr(self, mesh: Mesh) -> Tensor:
        return _scalar(mesh, self.learning_rate)

    def step_float(self) -> Tensor:
        """The 1-based number of this update, as float32 (made once)."""
        assert self.step is not None
        key = ("step", 0.0)
        t = self._consts.get(key)
        if t is None:
            t = ew.cast(self.step, "float32") + self.const(self.step.mesh, 1.0)
            self._consts[key] = t
        return t

    def slot_name(self, var: Variable, suffix: str) -> str:
        """The name of ``var``'s slot ``suffix`` (``adam_m``, ...):
        ``{var}/{suffix}``."""
        return f"{var.name}/{suffix}"

    def slot(self, var: Variable, suffix: str, shape: Shape | None = None) -> Tensor:
        """A zero-initialized, non-trainable slot variable named after ``var``
        (:meth:`slot_name`; in :meth:`var_shape` unless ``shape`` is given)."""
        return get_variable(
            var.mesh,
            self.slot_name(var, suffix),
            self.var_shape(var) if shape is None else shape,
            var.dtype,
            initializer=_zeros,
            trainable=False,
        )


class SgdOptimizer(Optimizer):
    """``var -= lr * grad``."""

    def apply_grad(self, grad: Tensor, var: Variable) -> list[Assign]:
        return [self.update(var, self.value(var) - grad * self.lr(var.mesh))]


class MomentumOptimizer(Optimizer):
    """Heavy-ball momentum: ``m = momentum * m + grad; var -= lr * m``
    (Nesterov: ``var -= lr * (grad + momentum * m)``)."""

    def __init__(
        self, learning_rate: Any, momentum: float = 0.9, nesterov: bool = False
    ) -> None:
        super().__init__(learning_rate)
        _check_unit("momentum", momentum)
        self.momentum = momentum
        self.nesterov = nesterov

    def apply_grad(self, grad: Tensor, var: Variable) -> list[Assign]:
        m = self.slot(var, "momentum")
        mu = self.const(var.mesh, self.momentum)
        new_m = m * mu + grad
        step = grad + new_m * mu if self.nesterov else new_m
        return [
            assign(m, new_m),
            self.update(var, self.value(var) - step * self.lr(var.mesh)),
        ]


class AdamWeightDecayOptimizer(Optimizer):
    """Adam with optional bias correction and decoupled weight decay (AdamW).

    ``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2`` and
    ``var -= lr_t * m / (sqrt(v) + eps) + lr * weight_decay_rate * var`` where,
    with bias correction, ``lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)`` (the
    paper's efficient form; without it ``lr_t = lr``).
    Variables whose name contains any of ``exclude_from_weight_decay`` (by
    default biases and norm scales) are not decayed.
    """

    def __init__(
        self,
        learning_rate: Any,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
        weight_decay_rate: float = 0.0,
        bias_correction: bool = True,
        exclude_from_weight_decay: Sequence[str] = ("bias", "scale"),
    ) -> None:
        super().__init__(learning_rate)
        _check_unit("beta1", beta1)
        _check_unit("beta2", beta2)
        _check_positive("epsilon", epsilon)
        if weight_decay_rate < 0:
            raise ConfigError(
                f"weight_decay_rate must be >= 0, got {weight_decay_rate!r}"
            )
        self.beta1 = beta1
        self.beta2 = beta2
        self.epsilon = epsilon
        self.weight_decay_rate = weight_decay_rate
        self.bias_correction = bias_correction
        self.exclude_from_weight_decay = tuple(exclude_from_weight_decay)

    def make_lr(self, mesh: Mesh) -> Tensor:
        lr = _scalar(mesh, self.learning_rate)
        if not self.bias_correction:
            return lr
        # Kingma & Ba's efficient form: fold both bias corrections into the
        # step size once, instead of correcting m and v of every variable.
        t = self.step_float()
        one = self.const(mesh, 1.0)
        c1 = one - ew.pow(self.const(mesh, self.beta1), t)
        c2 = one - ew.pow(self.const(mesh, self.beta2), t)
        return lr * ew.sqrt(c2) / c1

    def apply_grad(self, grad: Tensor, var: Variable) -> list[Assign]:
        mesh = var.mesh

        def c(value: float) -> Tensor:
            return self.const(mesh, value)

        m = self.slot(var, "adam_m")
        v = self.slot(var, "adam_v")
        new_m = m * c(self.beta1) + grad * c(1.0 - self.beta1)
        new_v = v * c(self.beta2) + ew.square(grad) * c(1.0 - self.beta2)
        update = new_m / (ew.sqrt(new_v) + c(self.epsilon)) * self.lr(mesh)
        value = self.value(var)
        if self.weight_decay_rate and not any(
            s in var.name for s in self.exclude_from_weight_decay
        ):
            # Decoupled (AdamW): decay by the uncorrected learning rate.
            lr = self.learning_rate
            wd = (
                lr * c(self.weight_decay_rate)
                if isinstance(lr, Tensor)
                else c(float(lr) * self.weight_decay_rate)
            )
            update = update + value * wd
        return [assign(m, new_m), assign(v, new_v), self.update(var, value - update)]


AdamOptimizer = AdamWeightDecayOptimizer


class AdafactorOptimizer(Optimizer):
    """Adafactor (Shazeer & Stern, 2018) with factored second moments.

    For a variable with two or more dims, the second moment is kept as a row
    vector (``var.shape`` minus its largest dim ``c``) and a column vector
    (``var.shape`` minus its second largest dim ``r``):
    ``v_r = d v_r + (1-d) mean_c(g^2 + eps1)``, ``v_c = d v_c + (1-d) mean_r(...)``
    with decay ``d = 1 - t^-decay_exponent``; the update is
    ``u = g / sqrt(v_r / mean_r(v_r) * v_c)``, clipped so that
    ``rms(u) <= clipping_threshold``, scaled by the learning rate (default:
    relative step ``min(0.01, 1/sqrt(t))``) times ``max(eps2, rms(var))`` when
    ``multiply_by_parameter_scale``.  ``beta1 > 0`` adds first-moment momentum.
    Variables with fewer than two dims keep an unfactored ``v``.
    """

    def __init__(
        self,
        learning_rate: Any = None,
        decay_exponent: float = 0.8,
        beta1: float = 0.0,
        clipping_threshold: float | None = 1.0,
        multiply_by_parameter_scale: bool = True,
        epsilon1: float = 1e-30,
        epsilon2: float = 1e-3,
    ) -> None:
        if learning_rate is not None and not isinstance(learning_rate, Tensor):
            _check_positive("learning_rate", learning_rate)
        self.learning_rate = learning_rate
        self.step = None
        _check_unit("beta1", beta1)
        _check_positive("decay_exponent", decay_exponent)
        self.decay_exponent = decay_exponent
        self.beta1 = beta1
        self.clipping_threshold = clipping_threshold
        self.multiply_by_parameter_scale = multiply_by_parameter_scale
        self.epsilon1 = epsilon1
        self.epsilon2 = epsilon2

    @staticmethod
    def factored_dims(shape: Shape) -> tuple[Dimension, Dimension] | None:
        """``(r, c)``: the second largest and largest dims, or None if < 2 dims."""
        if shape.ndims < 2:
            return None
        by_size = sorted(shape.dims, key=lambda d: d.size)
        return by_size[-2], by_size[-1]

    def make_lr(self, mesh: Mesh) -> Tensor:
        if self.learning_rate is not None:
            return _scalar(mesh, self.learning_rate)
        return ew.minimum(ew.rsqrt(self.step_float()), self.const(mesh, 0.01))

    def decay(self, mesh: Mesh) -> tuple[Tensor, Tensor]:
        """``(d, 1 - d)`` for this step, made once per apply_grads."""
        key = ("decay", 0.0)
        if key not in self._consts:
            t = self.step_float()
            keep = ew.pow(t, self.const(mesh, -self.decay_exponent))
            self._consts[key] = self.const(mesh, 1.0) - keep
            self._consts[("decay_complement", 0.0)] = keep
        return self._consts[key], self._consts[("decay_complement", 0.0)]

    def apply_grad(self, grad: Tensor, var: Variable) -> list[Assign]:
        mesh = var.mesh

        def c(value: float) -> Tensor:
            return self.const(mesh, value)

        value = self.value(var)
        shape = self.var_shape(var)
        decay, fresh = self.decay(mesh)
        gsq = ew.square(grad) + c(self.epsilon1)
        updates: list[Assign] = []
        dims = self.factored_dims(shape)
        if dims is None:
            v = self.slot(var, "adafactor_v")
            new_v = decay * v + fresh * gsq
            updates.append(assign(v, new_v))
            x = grad * ew.rsqrt(new_v)
        else:
            r, col = dims
            vr = self.slot(var, "adafactor_vr", shape - [col])
            vc = self.slot(var, "adafactor_vc", shape - [r])
            new_vr = decay * vr + fresh * red.reduce_mean(gsq, reduced_dim=col)
            new_vc = decay * vc + fresh * red.reduce_mean(gsq, reduced_dim=r)
            updates += [assign(vr, new_vr), assign(vc, new_vc)]
            row_mean = red.reduce_mean(new_vr, reduced_dim=r)
            x = grad * ew.rsqrt(new_vr / row_mean) * ew.rsqrt(new_vc)
        if self.clipping_threshold is not None:
            clip = ew.maximum(_rms(x) / c(self.clipping_threshold), c(1.0))
            x = x / clip
        lr = self.lr(mesh)
        if self.multiply_by_parameter_scale:
            lr = lr * ew.maximum(_rms(value), c(self.epsilon2))
        if self.beta1:
            m = self.slot(var, "adafactor_m")
            new_m = m * c(self.beta1) + x * c(1.0 - self.beta1)
            updates.append(assign(m, new_m))
            x = new_m
        updates.append(self.update(var, value - x * lr))
        return updates


def _rms(x: Tensor) -> Tensor:
    return ew.sqrt(red.reduce_mean(ew.square(x)))


def clip_by_global_norm(
    grads: Sequence[Tensor | None], clip_norm: float
) -> tuple[list[Tensor | None], Tensor]:
    """Scales ``grads`` so their joint L2 norm is at most ``clip_norm``.

    Returns the clipped gradients and the norm before clipping.
    """
    _check_positive("clip_norm", clip_norm)
    present = [g for g in grads if g is not None]
    if not present:
        raise GraphError("clip_by_global_norm: every gradient is None")
    sq = ew.add_n([red.reduce_sum(ew.square(g)) for g in present])
    norm = ew.sqrt(sq)
    mesh = present[0].mesh
    scale = constant(mesh, clip_norm, (), "float32") / ew.maximum(
        norm, constant(mesh, clip_norm, (), "float32")
    )
    return [None if g is None else g * scale for g in grads], norm


def make_optimizer(name: str, learning_rate: float | None = None) -> Optimizer:
    """An optimizer by name: ``sgd``, ``momentum``, ``adam``, ``adamw`` or
    ``adafactor`` (CLI helper)."""
    key = name.lower()
    if key == "sgd":
        return SgdOptimizer(learning_rate or 0.1)
    if key == "momentum":
        return MomentumOptimizer(learning_rate or 0.05)
    if key == "adam":
        return AdamWeightDecayOptimizer(learning_rate or 1e-3)
    if key == "adamw":
        return AdamWeightDecayOptimizer(learning_rate or 1e-3, weight_decay_rate=0.01)
    if key == "adafactor":
        return AdafactorOptimizer(learning_rate)
    raise ConfigError(
        f"unknown optimizer {name!r}; expected one of "
        "'sgd', 'momentum', 'adam', 'adamw', 'adafactor'"
    )


def training_gradients(
    losses: Sequence[Tensor], variables: Sequence[Any]
) -> list[Tensor | None]:
    """Gradients of ``losses`` for ``apply_grads``: of each variable's value,
    or, for a variable updated under slot names, of its read (the sum over its
    reads; still a pending sum, which ``apply_grads`` reduce-scatters)."""
    variables = [as_variable(v) for v in variables]
    targets: list[list[Tensor]] = []
    for v in variables:
        sharding = slot_sharding(v.graph, v.name)
        targets.append(list(sharding.reads) if sharding else [v.outputs[0]])
    flat = [t for ts in targets for t in ts]
    got = iter(gradients(list(losses), flat))
    out: list[Tensor | None] = []
    for ts in targets:
        parts = [g for g in (next(got) for _ in ts) if g is not None]
        out.append(
            None if not parts else parts[0] if len(parts) == 1 else ew.add_n(parts)
        )
    return out


def trainable_value_tensors(graph: Graph) -> list[Tensor]:
    """The value tensors of the graph's trainable variables (for ``gradients``)."""
    return [v.outputs[0] for v in graph.trainable_variables]

"""``mesh_tensorflow.optimize``: mtf_core's optimizers with Mesh TF's
constructors and defaults, registered with gin as Mesh TF's are.

The update rules are :mod:`mtf_core.optimize`'s; what differs is only what
Mesh TF programs pass and expect:

* ``AdamWeightDecayOptimizer(learning_rate, weight_decay_rate=0.0,
  beta_1=0.9, beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None)``:
  Mesh TF's (BERT's) Adam has no bias correction and decays every variable
  unless excluded;
* ``AdafactorOptimizer(multiply_by_parameter_scale=True, learning_rate=None,
  decay_rate=None, beta1=0.0, clipping_threshold=1.0, factored=True,
  epsilon1=1e-30, epsilon2=1e-3, min_dim_size_to_factor=128)``: second
  moments are factored only over dims of at least ``min_dim_size_to_factor``,
  and a given ``decay_rate`` is used as is;
* slots are named as Mesh TF names them (Adafactor's ``{var}_slot_v``,
  Momentum's ``{var}_momentum_v``; Adam's ``{var}/adam_m`` is mtf_core's
  too), so a Mesh TF program's checkpoint holds Mesh TF's names.

With gin installed (``pip install mtf-planner[compat]``) they are
configurable as ``optimize.AdafactorOptimizer`` etc., the names Mesh TF's
Transformer gin files use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from mtf_core import optimize as _core
from mtf_core.errors import ConfigError
from mtf_core.graph import Mesh, Tensor
from mtf_core.ops.reduce import reduce_mean
from mtf_core.ops.unary import sqrt, square
from mtf_core.ops.variables import Variable

# The rest of Mesh TF's module, as mtf_core.optimize has it.
from mtf_core.optimize import (
    STEP_NAME,
    Optimizer,
    _scalar,
    clip_by_global_norm,
    global_step,
    make_optimizer,
    trainable_value_tensors,
    training_gradients,
)
from mtf_core.shapes import Dimension, Shape

_Class = TypeVar("_Class", bound=Callable[..., Any])


def _gin(cls: _Class) -> _Class:
    """Registers ``cls`` with gin under Mesh TF's module, if gin is there."""
    try:
        import gin
    except ImportError:
        return cls
    try:
        return gin.configurable(cls, module="mesh_tensorflow.optimize")  # type: ignore[no-any-return]
    except ValueError:  # registered already (this module reloaded)
        return cls


class AdamWeightDecayOptimizer(_core.AdamWeightDecayOptimizer):
    """Mesh TF's Adam with decoupled weight decay (no bias correction)."""

    def __init__(
        self,
        learning_rate: Any,
        weight_decay_rate: float = 0.0,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        exclude_from_weight_decay: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            learning_rate,
            beta1=beta_1,
            beta2=beta_2,
            epsilon=epsilon,
            weight_decay_rate=weight_decay_rate,
            bias_correction=False,
            exclude_from_weight_decay=tuple(exclude_from_weight_decay or ()),
        )


class AdafactorOptimizer(_core.AdafactorOptimizer):
    """Mesh TF's Adafactor constructor on mtf_core's Adafactor, its slots
    named as Mesh TF's (``{var}_slot_v``, ``_slot_vr``, ``_slot_vc``,
    ``_slot_m``), so a Mesh TF checkpoint's slots restore by name."""

    _SLOTS = {
        "adafactor_v": "_slot_v",
        "adafactor_vr": "_slot_vr",
        "adafactor_vc": "_slot_vc",
        "adafactor_m": "_slot_m",
    }

    def slot_name(self, var: Variable, suffix: str) -> str:
        return var.name + self._SLOTS[suffix]

    def __init__(
        self,
        multiply_by_parameter_scale: bool = True,
        learning_rate: Any = None,
        decay_rate: Any = None,
        beta1: float = 0.0,
        clipping_threshold: float | None = 1.0,
        factored: bool = True,
        epsilon1: float = 1e-30,
        epsilon2: float = 1e-3,
        min_dim_size_to_factor: int = 128,
        stacked_dim_names: Sequence[str] | None = None,
        exclude_from_parameter_scale: Sequence[str] | None = None,
    ) -> None:
        if stacked_dim_names or exclude_from_parameter_scale:
            raise ConfigError(
                "AdafactorOptimizer: stacked_dim_names="
                f"{stacked_dim_names!r}, exclude_from_parameter_scale="
                f"{exclude_from_parameter_scale!r}; mtf_core's Adafactor has "
                "neither (leave them unset)"
            )
        super().__init__(
            learning_rate=learning_rate,
            beta1=beta1,
            clipping_threshold=clipping_threshold,
            multiply_by_parameter_scale=multiply_by_parameter_scale,
            epsilon1=epsilon1,
            epsilon2=epsilon2,
        )
        self.decay_rate = decay_rate
        self.factored = factored
        self.min_dim_size_to_factor = min_dim_size_to_factor

    def factored_dims(self, shape: Shape) -> tuple[Dimension, Dimension] | None:  # type: ignore[override]
        """The two largest dims if both are at least ``min_dim_size_to_factor``."""
        if not self.factored:
            return None
        dims = _core.AdafactorOptimizer.factored_dims(shape)
        if dims is None or dims[0].size < self.min_dim_size_to_factor:
            return None
        return dims

    def decay(self, mesh: Mesh) -> tuple[Tensor, Tensor]:
        if self.decay_rate is None:
            return super().decay(mesh)
        key = ("decay", 0.0)
        if key not in self._consts:
            d = _scalar(mesh, self.decay_rate)
            self._consts[key] = d
            self._consts[("decay_complement", 0.0)] = self.const(mesh, 1.0) - d
        return self._consts[key], self._consts[("decay_complement", 0.0)]


class MomentumOptimizer(_core.MomentumOptimizer):
    """Mesh TF's ``MomentumOptimizer(learning_rate, momentum)``, its slot
    named as Mesh TF's (``{var}_momentum_v``)."""

    def slot_name(self, var: Variable, suffix: str) -> str:
        assert suffix == "momentum", suffix
        return var.name + "_momentum_v"


class SgdOptimizer(_core.SgdOptimizer):
    """Mesh TF's ``SgdOptimizer(lr)``."""


def reduce_rms(x: Tensor, **kwargs: Any) -> Tensor:
    """The root mean square of ``x`` (``reduce_mean``'s keyword arguments)."""
    return sqrt(reduce_mean(square(x), **kwargs))


def product_learning_rate(
    step: Any,
    total_train_steps: Any,
    factors: Sequence[Any] = (),
    offset: Any = 0,
) -> Any:
    """Mesh TF's learning rate as a product of ``factors``: numbers, or
    schedules called as ``f(step - offset, total_train_steps - offset)``
    (``step`` may be a number or a TF scalar).  Gin-configurable as
    ``optimize.product_learning_rate``; without factors it is 1."""
    rate: Any = 1.0
    for factor in factors:
        rate *= (
            factor(step - offset, total_train_steps - offset)
            if callable(factor)
            else factor
        )
    return rate


AdamWeightDecayOptimizer = _gin(AdamWeightDecayOptimizer)  # type: ignore[misc]
AdafactorOptimizer = _gin(AdafactorOptimizer)  # type: ignore[misc]
SgdOptimizer = _gin(SgdOptimizer)  # type: ignore[misc]
MomentumOptimizer = _gin(MomentumOptimizer)  # type: ignore[misc]
product_learning_rate = _gin(product_learning_rate)
AdamOptimizer = AdamWeightDecayOptimizer

__all__ = [
    "STEP_NAME",
    "AdafactorOptimizer",
    "AdamOptimizer",
    "AdamWeightDecayOptimizer",
    "MomentumOptimizer",
    "Optimizer",
    "SgdOptimizer",
    "clip_by_global_norm",
    "global_step",
    "make_optimizer",
    "product_learning_rate",
    "reduce_rms",
    "trainable_value_tensors",
    "training_gradients",
]

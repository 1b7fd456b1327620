"""Weight initializers: ``callable(shape, dtype) -> full value`` (NumPy).

Values are drawn with NumPy from a seed derived from the variable's name, so a
model starts from the same weights whatever mesh and layout it is lowered on,
and without TensorFlow (mtf_core never imports it).  TensorFlow initializers
(``tf.zeros_initializer()``, ``tf.keras.initializers.*``) work as well: the
lowering calls any ``callable(shape, dtype)``.

``VarianceScalingInitializer`` is Mesh TensorFlow's dense-layer initializer: a
:class:`DenseInitializer` that ``layers.dense`` calls with the reduced and new
dims to get the variable's initializer.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from mtf_core.errors import ConfigError
from mtf_core.shapes import Dimension

_UNIT_SCALING = {"on": False}


def unit_scaling_convention(value: bool | None = None) -> bool:
    """Whether the unit-scaling convention is on (Mesh TensorFlow's switch,
    off by default): weights start with unit variance and
    :func:`mtf_core.layers.dense.us_einsum` divides each contraction by
    ``sqrt`` of the contracted size instead.

    ``unit_scaling_convention(True)`` turns it on for layers built afterwards
    (process-wide, as a gin binding is in Mesh TensorFlow).
    """
    if value is not None:
        _UNIT_SCALING["on"] = bool(value)
    return _UNIT_SCALING["on"]


def name_seed(name: str) -> int:
    """A deterministic 31-bit seed for the variable called ``name``."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def zeros_initializer() -> Callable[..., np.ndarray]:
    def init(shape: Sequence[int], dtype: Any = None) -> np.ndarray:
        return np.zeros(list(shape), dtype="float32")

    return init


def ones_initializer() -> Callable[..., np.ndarray]:
    def init(shape: Sequence[int], dtype: Any = None) -> np.ndarray:
        return np.ones(list(shape), dtype="float32")

    return init


def normal_initializer(stddev: float, seed_name: str) -> Callable[..., np.ndarray]:
    """Normal values clipped at 2 sigma, seeded by ``seed_name`` (what
    mtf_core's own layers draw; deterministic, so every layout starts from the
    same weights)."""
    seed = zlib.crc32(seed_name.encode())

    def init(shape: Sequence[int], dtype: Any = None) -> np.ndarray:
        rng = np.random.default_rng(seed)
        v = rng.standard_normal(list(shape), dtype=np.float32)
        return np.clip(v, -2.0, 2.0) * np.float32(stddev)

    return init


@dataclass(frozen=True)
class RandomInitializer:
    """Seeded random values: ``"normal"`` (stddev), ``"truncated_normal"``
    (stddev, redrawn beyond 2 sigma) or ``"uniform"`` in ``[-limit, limit]``
    with ``limit = stddev * sqrt(3)`` (the same variance).  ``seed_name`` is
    set by the layer that creates the variable (:meth:`named`)."""

    distribution: str
    stddev: float
    seed_name: str = ""

    def __post_init__(self) -> None:
        if self.distribution not in ("normal", "truncated_normal", "uniform"):
            raise ConfigError(
                f"initializer distribution {self.distribution!r} is unknown; "
                "expected 'normal', 'truncated_normal' or 'uniform'"
            )
        if not (math.isfinite(self.stddev) and self.stddev >= 0):
            raise ConfigError(f"initializer stddev {self.stddev!r} must be >= 0")

    def named(self, seed_name: str) -> RandomInitializer:
        """This initializer seeded by the variable's name."""
        return replace(self, seed_name=seed_name)

    def __call__(self, shape: Sequence[int], dtype: Any = None) -> np.ndarray:
        rng = np.random.default_rng(name_seed(self.seed_name))
        shape = list(shape)
        if self.distribution == "uniform":
            limit = self.stddev * 3.0**0.5
            return rng.uniform(-limit, limit, shape).astype(np.float32)
        v = rng.standard_normal(shape).astype(np.float32)
        if self.distribution == "truncated_normal":
            out = np.abs(v) > 2.0
            while out.any():  # redraw what falls beyond 2 sigma
                v[out] = rng.standard_normal(int(out.sum()))
                out = np.abs(v) > 2.0
        return v * np.float32(self.stddev)


def named_initializer(init: Any, seed_name: str) -> Any:
    """``init`` seeded by ``seed_name`` when it is one of ours (or what the
    installed provider gives for its distribution, see
    :func:`set_initializer_provider`)."""
    if not isinstance(init, RandomInitializer):
        return init
    if _PROVIDER:
        given = _PROVIDER[0](init.distribution, init.stddev)
        if given is not None:
            return given
    return init.named(seed_name)


_PROVIDER: list[Callable[[str, float], Any]] = []


def provided_or(distribution: str, stddev: float, fallback: Any) -> Any:
    """What the installed provider gives for ``distribution`` and ``stddev``
    (Mesh TensorFlow's own default for the variable), else ``fallback``."""
    if _PROVIDER:
        given = _PROVIDER[0](distribution, stddev)
        if given is not None:
            return given
    return fallback


def set_initializer_provider(provider: Callable[[str, float], Any] | None) -> None:
    """Installs ``provider(distribution, stddev) -> initializer or None``,
    asked when a layer creates a variable with one of the random
    initializers here (``"normal"``, ``"truncated_normal"``, ``"uniform"``):
    a Mesh TensorFlow compatibility layer returns TensorFlow's initializers
    (``tf.random_normal_initializer(stddev=...)``), as Mesh TensorFlow's
    layers create.  None (the default) keeps the NumPy draws seeded by the
    variable's name, which give every compilation the same weights."""
    _PROVIDER.clear()
    if provider is not None:
        _PROVIDER.append(provider)


class DenseInitializer:
    """An initializer ``layers.dense`` calls with ``(reduced_dims, new_dims)``
    to get the kernel's ``callable(shape, dtype)``."""

    def __call__(
        self, reduced_dims: Sequence[Dimension], new_dims: Sequence[Dimension]
    ) -> Any:
        raise NotImplementedError(type(self).__name__)


class VarianceScalingInitializer(DenseInitializer):
    """Variance ``scale / n``: ``n`` is the reduced (``"fan_in"``), new
    (``"fan_out"``) or average of both (``"fan_avg"``) sizes, or 1 under the
    unit-scaling convention (which needs ``"fan_in"``); ``distribution``
    ``"normal"`` draws a normal truncated at 2 sigma, ``"uniform"`` a uniform
    of the same variance."""

    def __init__(
        self, scale: float = 1.0, mode: str = "fan_in", distribution: str = "normal"
    ) -> None:
        self.scale = float(scale)
        self.mode = mode.lower()
        self.distribution = distribution.lower()
        if self.mode not in ("fan_in", "fan_out", "fan_avg"):
            raise ConfigError(
                f"VarianceScalingInitializer: mode {mode!r} is unknown; expected "
                "'fan_in', 'fan_out' or 'fan_avg'"
            )
        if self.distribution not in ("normal", "uniform"):
            raise ConfigError(
                f"VarianceScalingInitializer: distribution {distribution!r} is "
                "unknown; expected 'normal' or 'uniform'"
            )

    def __call__(
        self, reduced_dims: Sequence[Dimension], new_dims: Sequence[Dimension]
    ) -> RandomInitializer:
        fan_in = math.prod(d.size for d in reduced_dims)
        fan_out = math.prod(d.size for d in new_dims)
        unit = unit_scaling_convention()
        if unit and self.mode != "fan_in":
            raise ConfigError(
                f"VarianceScalingInitializer: the unit-scaling convention needs "
                f"mode 'fan_in', not {self.mode!r}"
            )
        n = {
            "fan_in": 1.0 if unit else fan_in,
            "fan_out": fan_out,
            "fan_avg": (fan_in + fan_out) / 2,
        }[self.mode]
        stddev = (self.scale / max(1.0, float(n))) ** 0.5
        dist = "truncated_normal" if self.distribution == "normal" else "uniform"
        return RandomInitializer(dist, stddev)

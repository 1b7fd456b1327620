"""Random numbers: ``random_uniform``, ``random_normal`` and ``dropout``.

Layouts never change results, random ones included: each op draws the *full*
tensor with a stateless TensorFlow generator seeded by ``(op seed,
lowering.seed)`` and every device keeps its slice of it (as
``import_tf_tensor`` does).  ``lowering.seed`` is the step counter of a
compiled function, so each call draws new numbers; an eager ``Lowering`` uses
the ``seed`` it is given.  The op seed defaults to a hash of the op's name,
which is deterministic in graph-building order.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from mtf_core import dtypes
from mtf_core.errors import ArgumentError, DTypeError, ShapeError
from mtf_core.graph import Mesh, Operation, Tensor, check_tensor
from mtf_core.ops.arguments import check_mesh
from mtf_core.seams import LoweringContext
from mtf_core.shapes import convert_to_shape

#: Distributions :class:`RandomOp` draws from.
DISTRIBUTIONS = ("uniform", "normal")


class RandomOp(Operation):
    """A tensor of random numbers: ``uniform(minval, maxval)`` or
    ``normal(mean, stddev)``, identical under every layout."""

    op_type = "Random"
    stateful = True

    def __init__(
        self,
        mesh: Mesh,
        shape: Any,
        distribution: str,
        params: tuple[float, float],
        dtype: Any,
        seed: int | None,
        name: str | None = None,
    ) -> None:
        if distribution not in DISTRIBUTIONS:
            raise ArgumentError(
                f"unknown distribution {distribution!r}; expected one of "
                f"{list(DISTRIBUTIONS)}"
            )
        dtype = dtypes.as_dtype_name(dtype)
        if distribution == "normal" and not dtypes.is_floating(dtype):
            raise DTypeError(f"random_normal: dtype {dtype} is not a floating dtype")
        if dtype not in dtypes.FLOATING | {"int32", "int64"}:
            raise DTypeError(
                f"random_uniform: dtype {dtype} is not supported; expected a "
                "floating dtype, int32 or int64"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ArgumentError(f"random seed {seed!r} is not an integer")
        super().__init__([], mesh=mesh, name=name or f"random_{distribution}")
        self.distribution = distribution
        self.params = (params[0], params[1])
        # A deterministic default: the name is unique in the graph and assigned
        # in building order, so rebuilding the graph gives the same numbers.
        self.seed = (
            seed if seed is not None else zlib.crc32(self.name.encode()) & 0x7FFFFFFF
        )
        self._add_output(convert_to_shape(shape), dtype)

    def flops(self) -> float:
        return 0.0

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        return []

    def lower(self, lowering: LoweringContext) -> None:
        tf = lowering.tf
        out = self.outputs[0]
        seed = tf.stack(
            [tf.constant(self.seed, tf.int64), tf.cast(lowering.seed, tf.int64)]
        )
        full_shape = out.shape.to_integer_list()
        a, b = self.params
        if not dtypes.is_floating(out.dtype):
            a, b = int(a), int(b)
        if self.distribution == "uniform":
            full = tf.random.stateless_uniform(
                full_shape, seed, minval=a, maxval=b, dtype=out.dtype
            )
        else:
            full = tf.random.stateless_normal(
                full_shape, seed, mean=a, stddev=b, dtype=out.dtype
            )
        lowering.set_tensor_lowering(
            out, lowering.mesh_impl(self).import_tf_tensor(full, out.shape)
        )

    def attrs(self) -> dict[str, Any]:
        return {
            "distribution": self.distribution,
            "params": list(self.params),
            "seed": self.seed,
            "dtype": self.outputs[0].dtype,
        }


def random_uniform(
    mesh: Mesh,
    shape: Any,
    minval: float = 0.0,
    maxval: float | None = None,
    dtype: Any = "float32",
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """Uniform random numbers in ``[minval, maxval)`` (``maxval`` defaults to 1
    for floats; int dtypes need it)."""
    check_mesh(mesh, "random_uniform")
    if maxval is None:
        if not dtypes.is_floating(dtype):
            raise DTypeError(
                f"random_uniform: dtype {dtypes.as_dtype_name(dtype)} needs maxval"
            )
        maxval = 1.0
    if not maxval > minval:
        raise ArgumentError(
            f"random_uniform: maxval {maxval!r} must be greater than minval {minval!r}"
        )
    return RandomOp(
        mesh, shape, "uniform", (minval, maxval), dtype, seed, name
    ).outputs[0]


def random_normal(
    mesh: Mesh,
    shape: Any,
    mean: float = 0.0,
    stddev: float = 1.0,
    dtype: Any = "float32",
    seed: int | None = None,
    name: str | None = None,
) -> Tensor:
    """Normally distributed random numbers."""
    check_mesh(mesh, "random_normal")
    if not stddev >= 0:
        raise ArgumentError(f"random_normal: stddev {stddev!r} must be >= 0")
    return RandomOp(mesh, shape, "normal", (mean, stddev), dtype, seed, name).outputs[0]


def dropout(
    x: Tensor,
    is_training: bool = True,
    keep_prob: float | None = None,
    rate: float | None = None,
    noise_shape: Any = None,
    name: str | None = None,
    seed: int | None = None,
) -> Tensor:
    """Zeroes each element with probability ``rate = 1 - keep_prob`` and scales
    the rest by ``1 / keep_prob`` (Mesh TensorFlow's signature:
    ``dropout(x, is_training, keep_prob=None, rate=None, noise_shape=None)``).

    ``is_training=False`` or ``keep_prob=1`` returns ``x``.  ``noise_shape``
    (a subset of ``x``'s dims) shares one draw along the missing dims.  The
    mask is an mtf tensor, so the gradient multiplies by the same mask; it is
    the same under every layout and new at each compiled step.  Integer
    tensors are masked but not scaled.
    """
    from mtf_core.ops import elementwise as ew

    check_tensor(x, "dropout:")
    if isinstance(is_training, float):
        # dropout(x, 0.1): a rate where Mesh TensorFlow's order has is_training.
        raise ArgumentError(
            f"dropout: is_training is {is_training!r}; expected True or False "
            "(give the rate as keep_prob=... or rate=...)"
        )
    if (keep_prob is None) == (rate is None):
        raise ArgumentError(
            f"dropout: give exactly one of keep_prob and rate (got keep_prob="
            f"{keep_prob!r}, rate={rate!r})"
        )
    if keep_prob is None:
        keep_prob = 1.0 - float(rate)  # type: ignore[arg-type]
        if not 0.0 < keep_prob <= 1.0:  # named as the caller gave it
            raise ArgumentError(f"dropout: rate {rate!r} must be in [0, 1)")
    if not 0.0 < keep_prob <= 1.0:
        raise ArgumentError(f"dropout: keep_prob {keep_prob!r} must be in (0, 1]")
    shape = x.shape if noise_shape is None else convert_to_shape(noise_shape)
    for d in shape:
        if d not in x.shape.dims:
            raise ShapeError(
                f"dropout: noise_shape dimension {d} is not a dimension of {x.name} "
                f"[{x.shape}]"
            )
    if keep_prob == 1.0 or not is_training:
        return x
    floating = dtypes.is_floating(x.dtype)
    u = random_uniform(
        x.mesh,
        shape,
        dtype=x.dtype if floating else "float32",
        seed=seed,
        name=name or "dropout_noise",
    )
    keep = ew.cast(ew.less(u, keep_prob), x.dtype)
    if floating:
        keep = keep * (1.0 / keep_prob)
    return x * keep

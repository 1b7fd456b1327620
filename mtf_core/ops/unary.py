"""Unary elementwise ops: math functions and activations, with their gradients.

``y = f(x)`` slice by slice under any layout; none of them communicate.  The
table :data:`UNARY` names each function's TensorFlow counterpart and its
gradient (written in mtf ops, so it lowers like everything else).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mtf_core.errors import ArgumentError
from mtf_core.graph import Operation, Tensor
from mtf_core.ops._local import tf_function
from mtf_core.seams import LoweringContext

#: A gradient formula: ``(x, y, dy) -> dx`` for ``y = f(x)``.
GradFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def _g_exp(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * y


def _g_log(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy / x


def _g_sqrt(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * 0.5 / y


def _g_rsqrt(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * -0.5 * y / x


def _g_square(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * x * 2.0


def _g_sigmoid(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * y * (1.0 - y)


def _g_tanh(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * (1.0 - square(y))


def _g_relu(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    from mtf_core.ops.elementwise import cast, greater

    return dy * cast(greater(x, 0.0), dy.dtype)


def _g_negative(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return negative(dy)


def _g_abs(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * sign(x)


def _g_reciprocal(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return negative(dy * square(y))


def _g_sin(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * cos(x)


def _g_cos(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return negative(dy * sin(x))


def _g_softplus(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    return dy * sigmoid(x)


def _g_silu(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    s = sigmoid(x)
    return dy * (s + x * s * (1.0 - s))


def _g_gelu(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    # tanh approximation: 0.5x(1+tanh(c(x+0.044715x^3)))
    c = 0.7978845608028654
    inner = (x + x * x * x * 0.044715) * c
    t = tanh(inner)
    dinner = (1.0 + x * x * (3 * 0.044715)) * c
    return dy * (0.5 * (1.0 + t) + x * 0.5 * (1.0 - t * t) * dinner)


def _g_elu(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    from mtf_core.ops.elementwise import cast, greater

    pos = cast(greater(x, 0.0), dy.dtype)
    return dy * (pos + (1.0 - pos) * (y + 1.0))


# SELU's constants (Klambauer et al. 2017, what tf.nn.selu uses).
SELU_ALPHA = 1.6732632423543772
SELU_SCALE = 1.0507009873554805


def _g_selu(x: Tensor, y: Tensor, dy: Tensor) -> Tensor:
    from mtf_core.ops.elementwise import cast, greater

    # x > 0: scale; else d/dx scale*alpha*(e^x - 1) = y + scale*alpha
    pos = cast(greater(x, 0.0), dy.dtype)
    return dy * (pos * SELU_SCALE + (1.0 - pos) * (y + SELU_SCALE * SELU_ALPHA))


#: name -> (TensorFlow function path, gradient formula or None).
UNARY: dict[str, tuple[str, GradFn | None]] = {
    "exp": ("math.exp", _g_exp),
    "log": ("math.log", _g_log),
    "sqrt": ("math.sqrt", _g_sqrt),
    "rsqrt": ("math.rsqrt", _g_rsqrt),
    "square": ("math.square", _g_square),
    "sigmoid": ("math.sigmoid", _g_sigmoid),
    "tanh": ("math.tanh", _g_tanh),
    "relu": ("nn.relu", _g_relu),
    "negative": ("math.negative", _g_negative),
    "abs": ("math.abs", _g_abs),
    "reciprocal": ("math.reciprocal", _g_reciprocal),
    "sin": ("math.sin", _g_sin),
    "cos": ("math.cos", _g_cos),
    "softplus": ("math.softplus", _g_softplus),
    "silu": ("nn.silu", _g_silu),
    "gelu": ("nn.gelu", _g_gelu),
    "elu": ("nn.elu", _g_elu),
    "selu": ("nn.selu", _g_selu),
    "sign": ("math.sign", None),
    "floor": ("math.floor", None),
    "ceil": ("math.ceil", None),
    "round": ("math.round", None),
    "logical_not": ("math.logical_not", None),
    "is_finite": ("math.is_finite", None),
}


class UnaryOp(Operation):
    """``y = f(x)`` slice by slice."""

    op_type = "Unary"

    def __init__(self, fn_name: str, x: Tensor, name: str | None = None) -> None:
        if fn_name not in UNARY:
            raise ArgumentError(
                f"unknown unary op {fn_name!r}; expected one of {sorted(UNARY)}"
            )
        super().__init__([x], name=name or fn_name)
        self.fn_name = fn_name
        out_dtype = "bool" if fn_name in ("is_finite",) else x.dtype
        self._add_output(x.shape, out_dtype)

    @property
    def has_gradient(self) -> bool:
        return UNARY[self.fn_name][1] is not None

    def gradient(self, grad_ys: Sequence[Tensor | None]) -> list[Tensor | None]:
        g = UNARY[self.fn_name][1]
        if g is None or grad_ys[0] is None:
            return [None]
        return [g(self.inputs[0], self.outputs[0], grad_ys[0])]

    def lower(self, lowering: LoweringContext) -> None:
        fn = tf_function(lowering.tf, UNARY[self.fn_name][0])
        if self.fn_name == "gelu":
            f = fn
            fn = lambda s: f(s, approximate=True)  # noqa: E731
        x = lowering.tensors[self.inputs[0]]
        lowering.set_tensor_lowering(
            self.outputs[0], lowering.mesh_impl(self).slicewise(fn, x)
        )

    def attrs(self) -> dict[str, Any]:
        return {"fn": self.fn_name}


def _unary(fn_name: str) -> Callable[..., Tensor]:
    def op(x: Tensor, name: str | None = None) -> Tensor:
        return UnaryOp(fn_name, x, name=name).outputs[0]

    op.__name__ = fn_name
    op.__doc__ = f"Elementwise {fn_name}."
    return op


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
square = _unary("square")
sigmoid = _unary("sigmoid")
tanh = _unary("tanh")
relu = _unary("relu")
negative = _unary("negative")
abs = _unary("abs")  # noqa: A001
reciprocal = _unary("reciprocal")
sin = _unary("sin")
cos = _unary("cos")
softplus = _unary("softplus")
silu = _unary("silu")
swish = silu
gelu = _unary("gelu")
elu = _unary("elu")
selu = _unary("selu")
sign = _unary("sign")
floor = _unary("floor")
ceil = _unary("ceil")
round = _unary("round")  # noqa: A001
logical_not = _unary("logical_not")
is_finite = _unary("is_finite")


def squared_relu(x: Tensor, name: str | None = None) -> Tensor:
    """``relu(x) ** 2`` (the Primer feed-forward activation; Mesh TF's name)."""
    return square(relu(x), name=name)

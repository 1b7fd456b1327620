"""Graphs and documents shared by the serialization tests: one builder per
op family group (each with placeholder feeds), and small documents that the
error tests break field by field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mtf_core as mtf

BATCH, ROWS, HIDDEN, CLASSES = 4, 6, 8, 3


class Built:
    """A graph with its mesh, placeholders (and the feeds they take) and outputs."""

    def __init__(self) -> None:
        self.graph = mtf.Graph()
        self.mesh = mtf.Mesh(self.graph, "m")
        self.feeds: dict[str, np.ndarray] = {}  # placeholder tensor name -> value
        self.outputs: list[mtf.Tensor] = []

    def placeholder(self, shape: str, name: str, dtype: str = "float32") -> mtf.Tensor:
        t = mtf.placeholder(self.mesh, shape, dtype, name=name)
        rng = np.random.RandomState(len(self.feeds))
        dims = t.shape.to_integer_list()
        if dtype == "float32":
            self.feeds[t.name] = rng.randn(*dims).astype(np.float32)
        else:
            self.feeds[t.name] = rng.randint(0, 3, size=dims).astype(dtype)
        return t


def build_mlp() -> Built:
    """A two-layer MLP with its gradients and SGD assigns."""
    b = Built()
    x = b.placeholder(f"batch:{BATCH},rows:{ROWS}", "x")
    labels = b.placeholder(f"batch:{BATCH},classes:{CLASSES}", "labels")
    w1 = mtf.get_variable(b.mesh, "w1", f"rows:{ROWS},hidden:{HIDDEN}")
    w2 = mtf.get_variable(b.mesh, "w2", f"hidden:{HIDDEN},classes:{CLASSES}")
    steps = mtf.get_variable(b.mesh, "steps", "", "int32", trainable=False)
    h = mtf.relu(mtf.einsum([x, w1], output_shape=f"batch:{BATCH},hidden:{HIDDEN}"))
    logits = mtf.einsum([h, w2], output_shape=f"batch:{BATCH},classes:{CLASSES}")
    loss = mtf.reduce_mean(
        mtf.layers.softmax_cross_entropy_with_logits(
            logits, mtf.softmax(labels, "classes"), f"classes:{CLASSES}"
        )
    )
    g1, g2 = mtf.gradients([loss], [w1, w2])
    mtf.assign(w1, w1 - g1 * 0.1)
    mtf.assign_sub(w2, g2 * 0.1)
    mtf.assign_add(steps, mtf.constant(b.mesh, 1, dtype="int32"))
    b.outputs = [loss, logits]
    return b


def build_core_families() -> Built:
    """One or more ops of every core family: creation, elementwise (every
    unary and binary fn), where, add_n, cast, identity, reductions, broadcast,
    custom gradients."""
    b = Built()
    x = b.placeholder(f"batch:{BATCH},hidden:{HIDDEN}", "x")
    y = b.placeholder(f"hidden:{HIDDEN},batch:{BATCH}", "y")
    v = b.placeholder(f"hidden:{HIDDEN}", "v")
    pos = mtf.abs(x) + 0.5  # keeps log/sqrt/pow finite
    outs: list[mtf.Tensor] = []
    for fn in sorted(mtf.ops.elementwise.UNARY):
        if fn == "logical_not":
            outs.append(mtf.logical_not(mtf.greater(x, 0.0)))
        else:
            outs.append(getattr(mtf, fn)(pos if fn in ("log", "sqrt", "rsqrt") else x))
    for fn in sorted(mtf.ops.elementwise.BINARY):
        if fn in ("logical_and", "logical_or"):
            outs.append(getattr(mtf, fn)(mtf.greater(x, 0.0), mtf.less(v, 0.5)))
        elif fn in ("floordiv", "mod", "pow"):
            outs.append(getattr(mtf, fn)(pos, mtf.abs(v) + 1.0))
        else:
            outs.append(getattr(mtf, fn)(x, y if fn in ("add", "sub") else v))
    outs.append(mtf.maximum(x, v, output_shape=f"hidden:{HIDDEN},batch:{BATCH}"))
    outs.append(mtf.where(mtf.greater(x, 0.0), x, v * 2.0))
    outs.append(mtf.add_n([x, mtf.transpose(y, x.shape), x * 3.0]))
    outs.append(mtf.cast(mtf.cast(x * 4.0, "int32"), "float32"))
    outs.append(mtf.stop_gradient(x) + mtf.identity(x))
    for reduce in (mtf.reduce_sum, mtf.reduce_max, mtf.reduce_min, mtf.reduce_mean):
        outs.append(reduce(x, reduced_dim="hidden"))
    outs.append(mtf.reduce_any(mtf.greater(x, 1.0), reduced_dim="batch"))
    outs.append(mtf.reduce_all(mtf.greater(x, -3.0)))
    outs.append(mtf.reduce_logsumexp(x, "hidden"))
    outs.append(mtf.log_softmax(x, "hidden"))
    outs.append(mtf.broadcast(v, f"classes:{CLASSES},hidden:{HIDDEN}"))
    outs.append(mtf.constant(b.mesh, [[1.0, -2.0, 3.0]] * 2, "two:2,three:3"))
    outs.append(mtf.zeros(b.mesh, f"batch:{BATCH}", "int32") + 7)
    outs.append(mtf.constant(b.mesh, True, dtype="bool"))
    custom = mtf.custom_gradient(
        lambda a: mtf.square(a), lambda output_grads, **_: [output_grads[0] * 2.0], [x]
    )
    outs.append(custom)
    outs.append(mtf.recompute_grad(lambda a: mtf.tanh(a) * 2.0, [x]))
    # gradients through the custom ops exist in the graph before serializing
    (gx,) = mtf.gradients([mtf.reduce_sum(custom + outs[-1])], [x])
    outs.append(gx)
    b.outputs = outs
    return b


def build_shape_and_indexing_families() -> Built:
    """Reshapes, the slicing family, indexing, random numbers, with gradients."""
    b = Built()
    x = b.placeholder(f"batch:{BATCH},hidden:{HIDDEN}", "x")
    ids = b.placeholder(f"batch:{BATCH}", "ids", "int32")
    outs: list[mtf.Tensor] = [
        mtf.reshape(x, f"batch:{BATCH},heads:2,d:{HIDDEN // 2}"),
        mtf.rename_dimension(x, "hidden", "features"),
        mtf.replace_dimensions(x, x.shape.dims[1], ["two:2", f"quarter:{HIDDEN // 2}"]),
    ]
    parts = mtf.split(x, "hidden", [2, HIDDEN - 2])
    outs += parts
    outs.append(mtf.concat([parts[1], parts[0]], "hidden"))
    outs.append(mtf.stack([x, x * 2.0], "pair", 1))
    outs += mtf.unstack(mtf.slice(x, 1, 2, "batch"), "batch")
    outs.append(mtf.pad(x, [1, 3], "hidden"))
    outs.append(mtf.shift(x, 1, "batch", wrap=False))
    outs.append(mtf.shift(x, -3, "hidden", wrap=True))
    outs.append(mtf.one_hot(ids, f"classes:{CLASSES}", on_value=2.0, off_value=-1.0))
    outs.append(mtf.range(b.mesh, f"hidden:{HIDDEN}", "float32") + x)
    emb = mtf.get_variable(b.mesh, "emb", f"vocab:5,hidden:{HIDDEN}")
    outs.append(mtf.gather(emb, ids, "vocab"))
    values, indices = mtf.top_k(x, "hidden", "k:3")
    outs += [values, indices, mtf.argmax(x, "hidden")]
    outs.append(mtf.cumsum(x, "hidden", exclusive=True, reverse=True))
    outs.append(mtf.random_uniform(b.mesh, f"batch:{BATCH}", 0, 10, "int32", seed=3))
    outs.append(mtf.random_normal(b.mesh, f"hidden:{HIDDEN}", 1.0, 2.0))
    outs.append(mtf.dropout(x, keep_prob=0.5))
    total = mtf.add_n(
        [mtf.reduce_sum(t) for t in outs if t.dtype == "float32" and t is not x]
    )
    (gx, gemb) = mtf.gradients([total], [x, emb])
    b.outputs = [*outs, total, gx, gemb]
    return b


def build_conv() -> Built:
    """2-D convolutions (SAME and strided VALID) and their gradient ops; the
    output channels are ``hidden`` so that model-split layouts split them."""
    from mtf_core.ops.conv import conv2d

    b = Built()
    x = b.placeholder(f"batch:{BATCH},h:5,w:6,cin:2", "x")
    f1 = mtf.get_variable(b.mesh, "f1", f"fh:3,fw:3,cin:2,hidden:{HIDDEN}")
    f2 = mtf.get_variable(b.mesh, "f2", f"fh:2,fw:2,hidden:{HIDDEN},cout:3")
    h = mtf.relu(conv2d(x, f1))
    y = conv2d(h, f2, strides=(2, 1), padding="VALID")
    loss = mtf.reduce_sum(mtf.square(y))
    grads = mtf.gradients([loss], [x, f1, f2])
    b.outputs = [y, loss, *grads]  # type: ignore[list-item]
    return b


GRAPHS: dict[str, Callable[[], Built]] = {
    "conv": build_conv,
    "mlp": build_mlp,
    "core_families": build_core_families,
    "shape_and_indexing_families": build_shape_and_indexing_families,
}

# attrs that describe what is not serialized (values, initializers)
NOT_PRESERVED = {"ImportTensor": {"placeholder"}, "Variable": {"initializer"}}


def comparable_attrs(op: mtf.Operation) -> dict[str, Any]:
    skip = NOT_PRESERVED.get(op.op_type, set())
    return {k: v for k, v in op.attrs().items() if k not in skip}


def round_trip(b: Built, **kw: Any) -> mtf.LoadedGraph:
    text = mtf.graph_to_json(b.graph, outputs=b.outputs)
    return mtf.graph_from_json(text, **kw)


def small_doc() -> dict[str, Any]:
    """x [batch:4, hidden:8] -> relu -> reduce_sum over hidden."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.placeholder(m, "batch:4,hidden:8", name="x")
    y = mtf.reduce_sum(mtf.relu(x), reduced_dim="hidden")
    w = mtf.get_variable(m, "w", "hidden:8")
    mtf.assign(w, mtf.reduce_sum(x, reduced_dim="batch"))
    return mtf.graph_to_dict(g, outputs=[y])


def slicing_doc() -> dict[str, Any]:
    """x -> split, slice, shift; ids -> one_hot; random numbers."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.placeholder(m, "batch:4,hidden:8", name="x")
    ids = mtf.placeholder(m, "batch:4", "int32", name="ids")
    mtf.split(x, "hidden", [3, 5])
    mtf.slice(x, 1, 2, "batch")
    mtf.shift(x, 1, "batch", wrap=False)
    mtf.one_hot(ids, "classes:3")
    mtf.random_uniform(m, "batch:4", seed=1)
    return mtf.graph_to_dict(g)

"""Small graphs the cost-model tests price and lower (no TensorFlow here).

Each builder returns a :class:`Case`: the graph, its mesh, the tensors to
export, and the layouts worth checking.  ``test_cost_units`` enumerates every
layout of them; ``test_cost_agreement`` lowers them with TensorFlow.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest

import mtf_core as mtf
from mtf_core.errors import LayoutError
from mtf_core.optimize import AdamWeightDecayOptimizer, SgdOptimizer


@dataclass
class Case:
    graph: mtf.Graph
    mesh: mtf.Mesh
    outputs: list[mtf.Tensor]
    layouts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def dim_names(self) -> list[str]:
        """The dims some layout may split (none that an op needs whole)."""
        ops = self.graph.operations
        whole = {n for op in ops for n in op.unsplittable_dims()}
        return sorted({n for op in ops for n in op.all_dim_names} - whole)


def _const(
    m: mtf.Mesh, shape: str, seed: int = 0, dtype: str = "float32"
) -> mtf.Tensor:
    s = mtf.convert_to_shape(shape)
    v = np.random.RandomState(seed).uniform(-1, 1, s.to_integer_list())
    return mtf.constant(m, v.astype(dtype), s, dtype)


def _new() -> tuple[mtf.Graph, mtf.Mesh]:
    g = mtf.Graph()
    return g, mtf.Mesh(g, "m")


# Layouts shared by the two-axis cases: meshes of 2, 4 and 8 devices.
MESHES = ["x:2", "x:4", "x:2;y:2", "x:2;y:4"]


def einsum_family() -> Case:
    """Matmul, a two-dim reduction (multi-axis allreduce), a chain that forces
    a pending sum, a three-input einsum and an outer product."""
    g, m = _new()
    x = _const(m, "b:4,k:4,l:2", 1)
    w = _const(m, "k:4,l:2,n:4", 2)
    y = mtf.einsum([x, w], output_shape="b:4,n:4")  # reduces k and l
    v = _const(m, "n:4,o:2", 3)
    z = mtf.einsum([y, v], output_shape="b:4,o:2")  # forces y
    u = _const(m, "o:2", 4)
    s = mtf.einsum([z, u, _const(m, "b:4", 5)], output_shape="b:4")
    outer = mtf.einsum([s, u], output_shape="b:4,o:2")
    layouts = [
        ("x:2", ""),
        ("x:2", "k:x"),
        ("x:4", "k:x"),
        ("x:2", "b:x"),
        ("x:2;y:2", "k:x;l:y"),
        ("x:2;y:2", "b:x;n:y"),
        ("x:2;y:4", "k:y;o:x"),
        ("x:2;y:4", "n:y;l:x"),
    ]
    return Case(g, m, [z, outer], layouts)


def lazy_sums() -> Case:
    """Pending sums: ``a@w1 + c@w2`` (one allreduce when both reduce over one
    axis), ``add_n`` of three, an identity read twice, a transposed sum (shapes
    differ: both forced), an exported pending value and an unused one."""
    g, m = _new()
    a, w1 = _const(m, "b:4,k:4", 1), _const(m, "k:4,h:4", 2)
    c, w2 = _const(m, "b:4,j:4", 3), _const(m, "j:4,h:4", 4)
    p1 = mtf.einsum([a, w1], output_shape="b:4,h:4")
    p2 = mtf.einsum([c, w2], output_shape="b:4,h:4")
    p3 = mtf.einsum([c, w2], output_shape="h:4,b:4")
    s = p1 + p2
    n = mtf.add_n([p1, p2, s])
    t = p1 + p3  # shapes differ: not kept pending
    i = mtf.identity(n)
    r1 = mtf.exp(i)
    r2 = i * 2.0
    exported = mtf.einsum([a, w1], output_shape="b:4,h:4")
    mtf.einsum([c, w2], output_shape="b:4,h:4")  # never read: never reduced
    layouts = [
        ("x:2", "k:x;j:x"),
        ("x:4", "k:x"),
        ("x:2;y:2", "k:x;j:y"),
        ("x:2;y:2", "k:x;j:x;b:y"),
        ("x:2;y:4", "j:y;k:y;h:x"),
        ("x:2", "h:x"),
    ]
    return Case(g, m, [r1, r2, t, exported], layouts)


def residual_stream() -> Case:
    """``x = x + f(x)`` three times with gradients: each ``f`` reads ``x`` (and
    forces it) before the add, so no sum stays pending across layers; the
    backward pass sums gradient contributions with add_n."""
    g, m = _new()
    x = mtf.einsum([_const(m, "b:4,k:2", 1), _const(m, "k:2,d:4", 2)], "b:4,d:4")
    for i in range(3):
        w = mtf.get_variable(m, f"w{i}", "d:4,f:4")
        v = mtf.get_variable(m, f"v{i}", "f:4,d:4")
        h = mtf.relu(mtf.einsum([x, w], output_shape="b:4,f:4"))
        x = x + mtf.einsum([h, v], output_shape="b:4,d:4")
    loss = mtf.reduce_sum(x * x)
    params = [op.outputs[0] for op in g.trainable_variables]
    grads = mtf.gradients([loss], params)
    layouts = [
        ("x:2", "f:x"),
        ("x:2", "k:x;f:x"),
        ("x:2", "d:x"),
        ("x:2;y:2", "b:x;f:y"),
        ("x:2;y:2", "d:x;f:y"),
        ("x:2;y:4", "f:y;b:x"),
    ]
    return Case(g, m, [loss, *grads], layouts)


def custom_gradient_family() -> Case:
    """A pending sum passed through ``custom_gradient`` (which reads, so
    forces, it) and added to another pending sum over the same axes."""
    g, m = _new()
    a, w1 = _const(m, "b:4,k:4", 1), _const(m, "k:4,h:4", 2)
    c, w2 = _const(m, "b:4,k:4", 3), _const(m, "k:4,h:4", 4)
    p2 = mtf.einsum([c, w2], output_shape="b:4,h:4")
    (p1,) = mtf.custom_gradient(
        lambda x, w: [mtf.einsum([x, w], output_shape="b:4,h:4")],
        lambda **_: [None, None],
        [a, w1],
    )
    out = mtf.exp(p1 + p2)
    layouts = [("x:2", "k:x"), ("x:2;y:2", "k:x;b:y"), ("x:4", "h:x")]
    return Case(g, m, [out], layouts)


def reductions() -> Case:
    """reduce_sum (pending, then forced by exp), reduce_max (at once),
    reduce_mean, softmax and reduce_any over split dims."""
    g, m = _new()
    x = _const(m, "b:4,l:4,v:4", 1)
    s = mtf.reduce_sum(x, reduced_dim="v")
    e = mtf.exp(s)
    mx = mtf.reduce_max(x, reduced_dim="l")
    mean = mtf.reduce_mean(x, output_shape="b:4")
    sm = mtf.softmax(x, reduced_dim="v")
    anyp = mtf.reduce_any(mtf.greater(x, 0.5), reduced_dim="b")
    layouts = [
        ("x:2", "v:x"),
        ("x:4", "l:x"),
        ("x:2;y:2", "v:x;l:y"),
        ("x:2;y:4", "b:x;v:y"),
        ("x:2;y:2", "b:y"),
    ]
    return Case(g, m, [e, mx, mean, sm, anyp], layouts)


def elementwise_and_broadcast() -> Case:
    """Unary, binary, where, cast, broadcast and transpose, fed by pending sums."""
    g, m = _new()
    a, w = _const(m, "b:4,k:4", 1), _const(m, "k:4,h:2", 2)
    p = mtf.einsum([a, w], output_shape="b:4,h:2")
    q = mtf.einsum([a, w], output_shape="b:4,h:2")
    wh = mtf.where(mtf.greater(p, 0.0), p, q)
    c = mtf.cast(wh, "bfloat16")
    bc = mtf.broadcast(mtf.einsum([a], output_shape="b:4"), "b:4,o:4")
    tr = mtf.transpose(p * q, "h:2,b:4")
    layouts = [
        ("x:2", "k:x"),
        ("x:2;y:2", "k:x;o:y"),
        ("x:4", "b:x"),
        ("x:2;y:4", "k:y;h:x"),
    ]
    return Case(g, m, [c, bc, tr], layouts)


def reshapes() -> Case:
    """Reshapes that keep, move (alltoall) or gather (allconcat) a split dim."""
    g, m = _new()
    x = _const(m, "a:4,b:4,c:2", 1)
    merged = mtf.reshape(x, "ab:16,c:2")
    split = mtf.reshape(merged, "p:2,q:8,c:2")
    renamed = mtf.rename_dimension(x, "b", "bb")
    flat = mtf.reshape(mtf.exp(renamed), "all:32")
    layouts = [
        ("x:2", "b:x;ab:x"),
        ("x:2", "a:x;q:x"),
        ("x:4", "b:x;all:x"),
        ("x:2;y:2", "a:x;bb:y;p:x"),
        ("x:2;y:2", "b:x;bb:x;all:y"),
        ("x:2;y:4", "ab:y;c:x"),
    ]
    return Case(g, m, [split, flat], layouts)


def slicing_family() -> Case:
    """concat, split, stack, unstack, slice, pad and shift over split dims."""
    g, m = _new()
    a, w = _const(m, "b:4,k:4", 1), _const(m, "k:4,s:4", 2)
    p = mtf.einsum([a, w], output_shape="b:4,s:4")
    q = mtf.einsum([a, w], output_shape="b:4,s:4")
    cat = mtf.concat([p, q], "s")
    parts = mtf.split(cat, "s", [2, 6])
    st = mtf.stack([p, q], "z", axis=0)
    un = mtf.unstack(p, "b")
    sl = mtf.slice(p, 1, 2, "s")
    pd = mtf.pad(q, [1, 3], "s")
    sh = mtf.shift(p, 1, "s", wrap=True)
    layouts = [
        ("x:2", "s:x"),
        ("x:2", "k:x"),
        ("x:4", "b:x"),
        ("x:2;y:2", "k:x;s:y;z:x"),
        ("x:2;y:4", "b:y;k:x;z:x"),
    ]
    return Case(g, m, [parts[1], st, un[0], sl, pd, sh], layouts)


def indexing_family() -> Case:
    """one_hot, range, gather (pending), top_k/argmax and cumsum over split dims."""
    g, m = _new()
    ids = mtf.constant(
        m, np.array([[1, 7], [3, 0], [5, 6], [2, 4]], "int32"), "b:4,l:2", "int32"
    )
    emb = _const(m, "v:8,d:4", 1)
    x = mtf.gather(emb, ids, "v")
    oh = mtf.one_hot(ids, mtf.Dimension("v", 8))
    r = mtf.range(m, mtf.Dimension("v", 8), "float32")
    logits = mtf.einsum([x, emb], output_shape="b:4,l:2,v:8") + r
    vals, idx = mtf.top_k(logits, "v", mtf.Dimension("k", 2))
    am = mtf.argmax(logits, "v")
    cs = mtf.cumsum(oh, "v")
    layouts = [
        ("x:2", "v:x"),
        ("x:4", "v:x"),
        ("x:2;y:2", "v:x;d:y"),
        ("x:2;y:4", "b:x;v:y"),
        ("x:2;y:2", "l:x;d:y"),
    ]
    return Case(g, m, [vals, idx, am, cs], layouts)


def random_family() -> Case:
    """random_uniform, random_normal and dropout under split layouts."""
    g, m = _new()
    x = _const(m, "b:4,h:4", 1)
    u = mtf.random_uniform(m, "b:4,h:4")
    n = mtf.random_normal(m, "h:4")
    d = mtf.dropout(x * u + n, rate=0.5)
    s = mtf.reduce_sum(d, reduced_dim="h")
    layouts = [("x:2", "h:x"), ("x:2;y:2", "b:x;h:y"), ("x:4", "b:x")]
    return Case(g, m, [s], layouts)


def conv_family() -> Case:
    """conv2d and its two gradient ops, with batch and channels split."""
    from mtf_core.ops.conv import conv2d

    g, m = _new()
    x = _const(m, "b:4,h:4,w:4,cin:4", 1)
    f = mtf.get_variable(m, "f", "fh:3,fw:3,cin:4,cout:4")
    y = conv2d(x, f)
    loss = mtf.reduce_sum(mtf.square(y))
    dx, df = mtf.gradients([loss], [x, f])
    layouts = [
        ("x:2", "b:x"),
        ("x:2", "cin:x"),
        ("x:4", "cout:x"),
        ("x:2;y:2", "b:x;cin:y"),
        ("x:2;y:4", "cout:y;b:x"),
    ]
    return Case(g, m, [loss, dx, df], layouts)


def mlp_training(optimizer: str = "sgd") -> Case:
    """A two-layer MLP's training step: forward, gradients, optimizer updates."""
    g, m = _new()
    b, r, h, c = (
        mtf.Dimension("batch", 8),
        mtf.Dimension("rows", 6),
        mtf.Dimension("hidden", 16),
        mtf.Dimension("classes", 4),
    )
    x = _const(m, "batch:8,rows:6", 1)
    w1 = mtf.get_variable(m, "w1", [r, h])
    w2 = mtf.get_variable(m, "w2", [h, c])
    hid = mtf.relu(mtf.einsum([x, w1], output_shape=[b, h]))
    logits = mtf.einsum([hid, w2], output_shape=[b, c])
    loss = mtf.reduce_mean(mtf.square(logits))
    grads = mtf.gradients([loss], [w1, w2])
    opt = AdamWeightDecayOptimizer(0.01) if optimizer == "adam" else SgdOptimizer(0.1)
    opt.apply_grads(grads, [w1, w2])
    layouts = [
        ("x:2", "batch:x"),
        ("x:4", "hidden:x"),
        ("x:2;y:2", "batch:x;hidden:y"),
        ("x:2;y:4", "batch:x;hidden:y"),
        ("x:2;y:4", "hidden:x;batch:y"),
        ("x:2;y:2", "rows:x;classes:y"),
    ]
    return Case(g, m, [loss], layouts)


BUILDERS: dict[str, Callable[[], Case]] = {
    "einsum": einsum_family,
    "lazy_sums": lazy_sums,
    "residual": residual_stream,
    "custom_gradient": custom_gradient_family,
    "reductions": reductions,
    "elementwise": elementwise_and_broadcast,
    "reshape": reshapes,
    "slicing": slicing_family,
    "indexing": indexing_family,
    "random": random_family,
    "conv": conv_family,
    "mlp_sgd": mlp_training,
    "mlp_adam": lambda: mlp_training("adam"),
}


def all_rules(dim_names: list[str], mesh_shape: str) -> Iterator[str]:
    """Every assignment of dims to at most one mesh axis each, as rule strings
    (validity is for the evaluator to judge)."""
    axes = [d.name for d in mtf.convert_to_shape(mesh_shape)]
    for choice in itertools.product([None, *axes], repeat=len(dim_names)):
        yield ";".join(f"{d}:{a}" for d, a in zip(dim_names, choice) if a is not None)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_case_layouts_are_all_valid_for_the_evaluator(name: str) -> None:
    from cost_models import evaluate

    case = BUILDERS[name]()
    assert case.layouts
    for mesh_shape, rules in case.layouts:
        try:
            evaluate(case.graph, mesh_shape, rules, "cpu-host", case.outputs)
        except LayoutError as e:  # pragma: no cover - a broken case
            pytest.fail(f"{name}: layout {rules!r} on {mesh_shape}: {e}")

"""The graphs calibration measures: short chains of one op class each.

Each :class:`SweepPoint` is a small mtf graph (no TensorFlow here) whose step
exercises one per-op-class feature of ``cost_models.op_classes`` much more
than the others: per-op overhead, matmuls of three sizes, elementwise and
transcendental passes, reductions, lookups, random draws, data movement,
assignments, and each collective kind over groups of 2, 4 and 8.  Every
device works at once, as in a real step, so the fitted rates include the
devices sharing the host.  The measurements store each graph as JSON, so the
fit (in ``cost_models``, which cannot import the lowering) rebuilds it and
reads its exact features.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import mtf_core as mtf
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.models import (
    MlpConfig,
    TransformerConfig,
    build_lm,
    build_mlp_classifier,
)

#: ``build(n)`` for ``n`` devices: the graph, its outputs and its updates.
Build: TypeAlias = Callable[[int], tuple[Graph, list[Tensor], list[Operation]]]


@dataclass(frozen=True)
class SweepPoint:
    """One calibration graph: ``build(n)`` for ``n`` devices gives ``(graph,
    outputs, updates)``; it runs on ``mesh(n)`` under ``rules``."""

    name: str
    mesh: Callable[[int], str]
    rules: str
    build: Build


def _all(n: int) -> str:
    return f"all:{n}"


def _two(n: int) -> str:
    return f"x:2;y:{n // 2}" if n >= 4 else f"x:1;y:{n}"


def _start(n: int, rows: int, cols: int) -> tuple[Graph, mtf.Mesh, Tensor]:
    g = Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.get_variable(m, "x", f"batch:{rows * n},d:{cols}")
    return g, m, x


def _scalar(x: Tensor) -> list[Tensor]:
    return [mtf.reduce_sum(x, output_shape=[])]


def _variables(*specs: tuple[str, str]) -> tuple[Graph, Tensor, Tensor]:
    """A graph with two variables of the given names and shapes."""
    g = Graph()
    m = mtf.Mesh(g, "m")
    a, b = (mtf.get_variable(m, name, shape) for name, shape in specs)
    return g, a, b


def _summed(k: int, term: Callable[[int], Tensor]) -> Tensor:
    """``term(0) + ... + term(k - 1)``."""
    acc = term(0)
    for i in range(1, k):
        acc = acc + term(i)
    return acc


def _chain(op: Callable[[Tensor], Tensor], rows: int, cols: int, k: int) -> Build:
    def build(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
        g, _, x = _start(n, rows, cols)
        for _ in range(k):
            x = op(x)
        return g, _scalar(x), []

    return build


def _matmul(rows: int, inner: int, k: int) -> Build:
    def build(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
        g, m, x = _start(n, rows, inner)
        w = mtf.get_variable(m, "w", f"d:{inner},e:{inner}")
        for _ in range(k):
            y = mtf.einsum([x, w], output_shape=f"batch:{rows * n},e:{inner}")
            x = mtf.rename_dimension(y, "e", "d")
        return g, _scalar(x), []

    return build


def _weight_grad(rows: int, cols: int, k: int, transposed: bool) -> Build:
    # Weight gradients: two activations contracted over a short batch, the
    # result split over its first dim (no sum pending).  With the operands
    # in the other order TensorFlow's einsum kernel transposes its result
    # (cost_models.einsum_transposes).
    def build(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
        g, x, y = _variables(
            ("x", f"batch:{rows},d:{cols * n}"), ("y", f"batch:{rows},e:{cols}")
        )

        def term(i: int) -> Tensor:
            pair = [y * float(i + 1), x] if transposed else [x, y * float(i + 1)]
            return mtf.einsum(pair, output_shape=f"d:{cols * n},e:{cols}")

        return g, _scalar(_summed(k, term)), []

    return build


def _attention(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    # Batched matmuls with transposes, as attention does them.
    g = Graph()
    m = mtf.Mesh(g, "m")
    q = mtf.get_variable(m, "q", f"batch:{n},heads:8,length:128,kv:32")
    kk = mtf.get_variable(m, "k", f"batch:{n},heads:8,memory:128,kv:32")
    s = mtf.einsum([q, kk], output_shape=f"batch:{n},heads:8,length:128,memory:128")
    outs = []
    for _ in range(4):
        o = mtf.einsum([s, kk], output_shape=f"batch:{n},heads:8,length:128,kv:32")
        s = mtf.einsum([o, kk], output_shape=f"batch:{n},heads:8,length:128,memory:128")
        outs.append(o)
    return g, _scalar(s), []


def _lookup(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    # An embedding lookup and its gradient (a segment sum), 4 times.
    g = Graph()
    m = mtf.Mesh(g, "m")
    vocab = mtf.Dimension("vocab", 4096)
    ids = mtf.cast(
        mtf.random_uniform(m, f"batch:{8 * n},length:128", maxval=4096.0, seed=1),
        "int32",
    )
    w = mtf.get_variable(m, "w", "vocab:4096,d:128")
    hot = mtf.one_hot(ids, vocab)
    outs = []
    for _ in range(4):
        e = mtf.einsum([hot, w], output_shape=f"batch:{8 * n},length:128,d:128")
        dw = mtf.einsum([hot, e], output_shape="vocab:4096,d:128")
        w = w + dw * 1e-6
        outs.append(e)
    return g, _scalar(w), []


def _movement(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    g, _, x = _start(n, 256, 512)
    for _ in range(4):
        a = mtf.slice(x, 0, 256, "d")
        b = mtf.slice(x, 256, 256, "d")
        x = mtf.concat([b, a], "d")
    return g, _scalar(x), []


def _assign(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    g = Graph()
    m = mtf.Mesh(g, "m")
    updates: list[Operation] = []
    for i in range(6):
        v = mtf.get_variable(m, f"v{i}", f"batch:{256 * n},d:512")
        updates.append(mtf.assign(v, v * 0.5))
    return g, [], updates


def _random(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    g = Graph()
    m = mtf.Mesh(g, "m")
    total = _summed(4, lambda i: mtf.random_uniform(m, f"batch:{64 * n},d:512", seed=i))
    return g, _scalar(total), []


def _allreduce(rows: int, k: int) -> Build:
    # x[batch, d] @ w[d, e] with d split: each product is a pending sum that
    # the next op forces (an allreduce of rows x e floats).
    def build(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
        g, x, w = _variables(
            ("x", f"batch:{rows},d:{8 * n}"), ("w", f"d:{8 * n},e:{rows}")
        )

        def term(i: int) -> Tensor:
            y = mtf.einsum([x * float(i + 1), w], output_shape=f"batch:{rows},e:{rows}")
            return mtf.relu(y)

        return g, _scalar(_summed(k, term)), []

    return build


def _outer_reduce(rows: int, cols: int, k: int) -> Build:
    # Sums over the rows of a [rows, cols] slice that keep its innermost dim,
    # as bias and layer-norm gradients sum over the tokens (d is split, so
    # no allreduce); k variables, so that no two sums are the same op.
    def build(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
        g = Graph()
        m = mtf.Mesh(g, "m")
        rows_dim = mtf.Dimension("batch", rows)
        sums = [
            mtf.reduce_sum(
                mtf.get_variable(m, f"x{i}", f"batch:{rows},d:{cols * n}"),
                reduced_dim=rows_dim,
            )
            for i in range(k)
        ]
        return g, _scalar(mtf.add_n(sums)), []

    return build


def _relayout(kind: str, rows: int, k: int) -> Build:
    # A reshape to a dim the rules leave whole (allconcat) or split on the
    # same axis as another dim (alltoall).
    def build(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
        g = Graph()
        m = mtf.Mesh(g, "m")
        x = mtf.get_variable(m, "x", f"a:{rows},b:{rows}")
        outs = []
        for i in range(k):
            y = x * float(i + 1)
            new = f"a:{rows},c:{rows}" if kind == "allconcat" else f"a2:{rows},c:{rows}"
            outs.append(mtf.reduce_sum(mtf.reshape(y, new), output_shape=[]))
        return g, [mtf.add_n(outs)], []

    return build


def _tiny_lm(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    cfg = TransformerConfig(
        num_layers=1,
        d_model=128,
        heads=8,
        d_kv=16,
        d_ff=512,
        vocab=2048,
        batch=2 * n,
        length=64,
    )
    model = build_lm(cfg, optimizer="adam", learning_rate=1e-3)
    return model.graph, [model.loss], list(model.updates)


def _small_mlp(n: int) -> tuple[Graph, list[Tensor], list[Operation]]:
    cfg = MlpConfig(
        batch=128 * n, features=256, hidden=512, classes=16, num_hidden_layers=2
    )
    model = build_mlp_classifier(cfg, optimizer="adam", learning_rate=1e-3)
    return model.graph, [model.loss], list(model.updates)


def _axpy(x: Tensor) -> Tensor:
    return x * 1.0001 + x


def _tanh(x: Tensor) -> Tensor:
    return mtf.tanh(x)


def _center(x: Tensor) -> Tensor:
    return x - mtf.reduce_sum(x, reduced_dim=x.shape.dims[-1])


def sweep_points(n: int) -> list[SweepPoint]:
    """The calibration graphs for ``n`` devices (n >= 2)."""
    pts = [
        SweepPoint(
            "overhead", _all, "batch:all", _chain(lambda x: x * 1.0001, 8, 16, 48)
        ),
        SweepPoint(
            "elementwise-256k",
            _all,
            "batch:all",
            _chain(lambda x: x * 1.0001 + x, 128, 512, 8),
        ),
        SweepPoint(
            "elementwise-2m",
            _all,
            "batch:all",
            _chain(lambda x: x * 1.0001 + x, 1024, 512, 6),
        ),
        SweepPoint(
            "transcendental-256k",
            _all,
            "batch:all",
            _chain(lambda x: mtf.tanh(x), 128, 512, 12),
        ),
        SweepPoint(
            "transcendental-2m",
            _all,
            "batch:all",
            _chain(lambda x: mtf.exp(x * -0.01), 1024, 512, 6),
        ),
        SweepPoint(
            "reduce-2m",
            _all,
            "batch:all",
            _chain(
                lambda x: x - mtf.reduce_sum(x, reduced_dim=mtf.Dimension("d", 512)),
                1024,
                512,
                6,
            ),
        ),
        SweepPoint("matmul-64x256", _all, "batch:all", _matmul(64, 256, 12)),
        SweepPoint("matmul-256x512", _all, "batch:all", _matmul(256, 512, 6)),
        SweepPoint("matmul-512x1024", _all, "batch:all", _matmul(512, 1024, 3)),
        SweepPoint("matmul-8x1024", _all, "batch:all", _matmul(8, 1024, 12)),
        SweepPoint("wgrad-64x512", _all, "d:all", _weight_grad(64, 512, 6, False)),
        SweepPoint(
            "wgrad-transposed-64x512", _all, "d:all", _weight_grad(64, 512, 6, True)
        ),
        SweepPoint(
            "wgrad-transposed-64x1024", _all, "d:all", _weight_grad(64, 1024, 3, True)
        ),
        SweepPoint("attention", _all, "batch:all", _attention),
        SweepPoint("lookup", _all, "batch:all", _lookup),
        SweepPoint("random", _all, "batch:all", _random),
        SweepPoint("movement", _all, "batch:all", _movement),
        SweepPoint("assign", _all, "batch:all", _assign),
        SweepPoint("allreduce-all-64k", _all, "d:all", _allreduce(128, 8)),
        SweepPoint("allreduce-all-1m", _all, "d:all", _allreduce(512, 4)),
        # Large sums (attention scores reduced over a split d_kv are 16 MiB).
        SweepPoint("allreduce-all-4m", _all, "d:all", _allreduce(1024, 2)),
        SweepPoint("allreduce-all-16m", _all, "d:all", _allreduce(2048, 1)),
        SweepPoint("allconcat-all-4m", _all, "b:all", _relayout("allconcat", 2048, 2)),
        SweepPoint("allconcat-all", _all, "b:all", _relayout("allconcat", 512, 4)),
        SweepPoint("alltoall-all", _all, "b:all;a2:all", _relayout("alltoall", 512, 4)),
    ]
    # Elementwise work across cache sizes: 64 KiB, 1, 4 and 16 MiB slices.
    for rows in (32, 512, 2048, 8192):
        pts.append(
            SweepPoint(
                f"elementwise-{rows * 2}k",
                _all,
                "batch:all",
                _chain(_axpy, rows, 512, 6),
            )
        )
    pts += [
        SweepPoint("transcendental-1m", _all, "batch:all", _chain(_tanh, 512, 512, 6)),
        SweepPoint("reduce-256k", _all, "batch:all", _chain(_center, 128, 512, 6)),
    ]
    # Sums over an outer dim (the innermost kept): 2, 4 and 16 MiB slices.
    pts += [
        SweepPoint("reduce-outer-2m", _all, "d:all", _outer_reduce(512, 1024, 6)),
        SweepPoint("reduce-outer-4m", _all, "d:all", _outer_reduce(4096, 256, 4)),
        SweepPoint("reduce-outer-16m", _all, "d:all", _outer_reduce(4096, 1024, 4)),
    ]
    # Small whole training steps (not the benchmark's models): the op mix of a
    # real step, with its layout changes, under data- and model-parallel rules.
    pts += [
        SweepPoint("tiny-lm-data", _all, "batch:all", _tiny_lm),
        SweepPoint("tiny-lm-model", _all, "d_ff:all;heads:all;vocab:all", _tiny_lm),
        SweepPoint("tiny-lm-length", _all, "length:all", _tiny_lm),
        SweepPoint("small-mlp-data", _all, "batch:all", _small_mlp),
        SweepPoint("small-mlp-model", _all, "hidden:all", _small_mlp),
    ]
    if n >= 4:
        pts += [
            SweepPoint("tiny-lm-2d", _two, "batch:x;d_ff:y;heads:y;vocab:y", _tiny_lm),
            SweepPoint("small-mlp-2d", _two, "batch:x;hidden:y", _small_mlp),
            SweepPoint("allreduce-x-1m", _two, "d:x", _allreduce(512, 4)),
            SweepPoint("allreduce-y-1m", _two, "d:y", _allreduce(512, 4)),
            SweepPoint("allconcat-y", _two, "b:y", _relayout("allconcat", 512, 4)),
        ]
    return pts

"""One Transformer LM training graph, written once against the API subset that
Mesh TensorFlow 0.1.21 and mtf_core share, so both libraries build the same
graph in a side-by-side benchmark.  ``mtf`` is the library module;
``make_input(mesh, shape, name)`` returns the int32 token tensor (a placeholder
in mtf_core, an imported tf placeholder in Mesh TensorFlow).

Per layer: self-attention (q, k, v, o projections over heads x d_kv, softmax
over memory_length) and a relu feed-forward over d_ff, both residual; tied
nothing; SGD updates.  No layer norm or masks: the subset is what both have.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LMConfig:
    layers: int = 8
    d_model: int = 256
    d_ff: int = 1024
    heads: int = 8
    d_kv: int = 32
    vocab: int = 8192
    batch: int = 32
    length: int = 128


def build_lm(
    mtf: Any, mesh: Any, cfg: LMConfig, make_input: Any
) -> tuple[Any, list[Any], Any]:
    """Returns (loss, update_ops, token_input)."""
    D = mtf.Dimension
    batch, length = D("batch", cfg.batch), D("length", cfg.length)
    memory = D("memory_length", cfg.length)
    d_model, d_ff = D("d_model", cfg.d_model), D("d_ff", cfg.d_ff)
    heads, d_kv, vocab = (
        D("heads", cfg.heads),
        D("d_kv", cfg.d_kv),
        D("vocab", cfg.vocab),
    )
    tokens = make_input(mesh, mtf.Shape([batch, length]), "tokens")

    def var(name: str, dims: list[Any]) -> Any:
        return mtf.get_variable(mesh, name, mtf.Shape(dims))

    emb = var("w_embedding", [vocab, d_model])
    x = mtf.einsum(
        [mtf.one_hot(tokens, vocab, dtype=mtf_float(mtf)), emb],
        output_shape=mtf.Shape([batch, length, d_model]),
    )
    for i in range(cfg.layers):
        wq = var(f"l{i}_q", [d_model, heads, d_kv])
        wk = var(f"l{i}_k", [d_model, heads, d_kv])
        wv = var(f"l{i}_v", [d_model, heads, d_kv])
        wo = var(f"l{i}_o", [heads, d_kv, d_model])
        q = mtf.einsum([x, wq], output_shape=mtf.Shape([batch, length, heads, d_kv]))
        xm = mtf.rename_dimension(x, "length", "memory_length")
        k = mtf.einsum([xm, wk], output_shape=mtf.Shape([batch, memory, heads, d_kv]))
        v = mtf.einsum([xm, wv], output_shape=mtf.Shape([batch, memory, heads, d_kv]))
        logits = mtf.einsum(
            [q, k], output_shape=mtf.Shape([batch, heads, length, memory])
        )
        weights = mtf.softmax(logits * (cfg.d_kv**-0.5), memory)
        o = mtf.einsum(
            [weights, v], output_shape=mtf.Shape([batch, heads, length, d_kv])
        )
        x = x + mtf.einsum([o, wo], output_shape=mtf.Shape([batch, length, d_model]))
        w1 = var(f"l{i}_ff1", [d_model, d_ff])
        w2 = var(f"l{i}_ff2", [d_ff, d_model])
        h = mtf.relu(mtf.einsum([x, w1], output_shape=mtf.Shape([batch, length, d_ff])))
        x = x + mtf.einsum([h, w2], output_shape=mtf.Shape([batch, length, d_model]))
    w_out = var("w_vocab", [d_model, vocab])
    logits = mtf.einsum([x, w_out], output_shape=mtf.Shape([batch, length, vocab]))
    targets = mtf.one_hot(tokens, vocab, dtype=mtf_float(mtf))
    loss = mtf.reduce_mean(
        mtf.layers.softmax_cross_entropy_with_logits(logits, targets, vocab)
    )
    params = [v.outputs[0] for v in mesh.graph.trainable_variables]
    grads = mtf.gradients([loss], params)
    updates = [mtf.assign(p, p - g * 0.01) for p, g in zip(params, grads)]
    return loss, updates, tokens


def mtf_float(mtf: Any) -> Any:
    return getattr(mtf, "float32", None) or __import__("tensorflow").float32


def parse_args() -> argparse.Namespace:
    """The command line both runners take."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["lower", "auto"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mesh", default="x:2;y:4")
    ap.add_argument("--layout", default="batch:x;d_ff:y;heads:y;vocab:y")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument(
        "--call",
        choices=["auto_mtf", "auto_layout"],
        default="auto_mtf",
        help="auto mode: Mesh TensorFlow's auto_mtf.layout, or (ours only) "
        "mtf.auto_layout with its defaults",
    )
    return ap.parse_args()


def build_timed(
    mtf: Any, library: str, args: argparse.Namespace, make_input: Any
) -> tuple[Any, ...]:
    """Builds the graph for ``args``; returns (graph, loss, updates, tokens,
    mesh_shape, result dict with the build time)."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    t0 = time.perf_counter()
    loss, updates, tokens = build_lm(
        mtf, mesh, LMConfig(layers=args.layers), make_input
    )
    out = {
        "library": library,
        "mode": args.mode,
        "layers": args.layers,
        "mesh": args.mesh,
        "build_s": time.perf_counter() - t0,
    }
    return mesh, loss, updates, tokens, mtf.convert_to_shape(args.mesh), out

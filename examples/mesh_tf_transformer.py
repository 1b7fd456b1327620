"""Mesh TensorFlow's own Transformer package, unchanged, trained on mtf_core.

    .venv/bin/python examples/mesh_tf_transformer.py --steps 5

Fetches the mesh-tensorflow 0.1.21 wheel from PyPI (once, into
``.cache/conformance``; Mesh TF's code is never committed here), loads its
``transformer`` package through :mod:`mtf_core.compat` and builds a 2-layer
language model (``Unitransformer``: self-attention and ReLU feed-forward
layers, RMS norm, Adafactor) on 4 logical CPUs.  It trains the same initial
weights under a data-parallel and a model-parallel layout (the losses agree),
saves the weights after the data-parallel run and resumes them under the
model-parallel layout, and decodes greedily with Mesh TF's own
``sample_autoregressive`` (a ``while_loop``).  The text is Python's own
``this`` module (the Zen of Python), byte-level.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.bootstrap import install_stand_ins  # noqa: E402
from conformance.run import fetch_wheel, unpack  # noqa: E402

BATCH, LENGTH, VOCAB = 4, 16, 128


def load_mesh_tf() -> Any:
    """``mesh_tensorflow`` on mtf_core, with Mesh TF's transformer package."""
    cache = ROOT / ".cache" / "conformance"
    mesh_tf_dir, _ = unpack(fetch_wheel(cache), cache)
    install_stand_ins()  # TF 2.21 lacks the Estimator modules it imports
    import mtf_core.compat

    mtf_core.compat.add_mesh_tf_path(mesh_tf_dir)
    import mesh_tensorflow

    return mesh_tensorflow


def text_batches(seed: int = 0) -> np.ndarray:
    """Byte-level windows of the Zen of Python (``import this``'s text)."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing it prints it
        import this

    data = np.frombuffer(codecs.decode(this.s, "rot13").encode(), np.uint8)
    starts = np.random.RandomState(seed).randint(0, len(data) - LENGTH, BATCH)
    return np.stack([data[s : s + LENGTH] for s in starts]).astype(np.int32)


def build(mtf: Any, decoding: bool = True) -> dict[str, Any]:
    """The LM's graph: loss, Adafactor updates and (``decoding``) greedy
    samples and beam search."""
    import tensorflow as tf
    from mesh_tensorflow.transformer import transformer, transformer_layers

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    shape = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
    layers = [
        transformer_layers.SelfAttention(num_heads=4, key_value_size=8),
        transformer_layers.DenseReluDense(hidden_size=64),
    ] * 2
    stack = transformer.LayerStack(
        layers,
        sublayers_initial=[transformer.sublayer_dropout],
        sublayers_per_layer=[
            transformer.sublayer_rms_norm,
            transformer.sublayer_call_layer,
            transformer.sublayer_dropout,
            transformer.sublayer_residual,
        ],
        sublayers_final=[transformer.sublayer_rms_norm, transformer.sublayer_dropout],
    )
    model = transformer.Unitransformer(
        layer_stack=stack,
        d_model=32,
        input_vocab_size=VOCAB,
        output_vocab_size=VOCAB,
        autoregressive=True,
        max_length=LENGTH,
    )
    inputs = mtf.placeholder(mesh, shape, dtype=tf.int32)
    targets = mtf.placeholder(mesh, shape, dtype=tf.int32)
    _, loss = model.call_simple(
        inputs=inputs, targets=targets, compute_loss=True, mode="eval"
    )
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.AdafactorOptimizer(learning_rate=0.01).apply_grads(
        grads, variables
    )
    built = dict(
        mtf=mtf, graph=graph, mesh=mesh, inputs=inputs, targets=targets,
        loss=loss, updates=updates,
    )  # fmt: skip
    if not decoding:
        return built
    samples = model.sample_autoregressive(inputs, temperature=0.0)
    beam_dim = mtf.Dimension("beam", 2)
    beam_inputs = mtf.placeholder(mesh, [shape[0], beam_dim, shape[1]], dtype=tf.int32)
    beams = model.beam_search(beam_inputs, mtf.constant(mesh, LENGTH, dtype=tf.int32))
    return built | dict(samples=samples, beam_inputs=beam_inputs, beams=beams)


def train(
    m: dict[str, Any], layout: tuple[str, str], state: dict, steps: int, first: int = 0
) -> Any:
    """Steps ``first .. first+steps-1`` from ``state`` under ``layout``;
    returns (losses, new state)."""
    mtf = m["mtf"]
    shape, rules = layout
    n = mtf.convert_to_shape(shape).size
    impl = mtf.PlacementMeshImpl(shape, rules, mtf.logical_devices(4)[:n])
    step = mtf.compile_function(
        m["graph"], {m["mesh"]: impl}, [m["inputs"], m["targets"]], [m["loss"]],
        m["updates"],
    )  # fmt: skip
    if state:
        step.variables.load_dict(state)
    losses = []
    for i in range(first, first + steps):
        x = text_batches(i)
        losses.append(float(step(x, x)[0]))
    return losses, step.variables.to_dict()


def decode(m: dict[str, Any], state: dict, prompt: bytes) -> list[bytes]:
    mtf = m["mtf"]
    impl = mtf.PlacementMeshImpl("all:4", "batch:all", mtf.logical_devices(4))
    fn = mtf.compile_function(
        m["graph"], {m["mesh"]: impl}, [m["inputs"]], [m["samples"]]
    )
    names = {v.name for v in fn.variables.variables}
    fn.variables.load_dict({k: v for k, v in state.items() if k in names})
    ids = np.zeros((BATCH, LENGTH), np.int32)
    ids[:, : len(prompt)] = np.frombuffer(prompt, np.uint8)
    return [bytes(row.astype(np.uint8)) for row in fn(ids)[0]]


def beam_decode(m: dict[str, Any], state: dict) -> list[bytes]:
    """Mesh TF's ``beam_search`` (2 beams) from empty prompts: the best beam."""
    mtf = m["mtf"]
    impl = mtf.PlacementMeshImpl("all:4", "batch:all", mtf.logical_devices(4))
    fn = mtf.compile_function(
        m["graph"], {m["mesh"]: impl}, [m["beam_inputs"]], [m["beams"]]
    )
    names = {v.name for v in fn.variables.variables}
    fn.variables.load_dict({k: v for k, v in state.items() if k in names})
    out = fn(np.zeros((BATCH, 2, LENGTH), np.int32))[0]
    return [bytes(row.astype(np.uint8)) for row in out]


DATA_PARALLEL = ("all:4", "batch:all")
MODEL_PARALLEL = ("all:4", "heads:all;d_ff:all")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    mtf = load_mesh_tf()
    m = build(mtf)
    # The same initial weights under both layouts (Mesh TF's initializers are
    # unseeded: take the first compile's and load them into the second).
    _, init = train(m, DATA_PARALLEL, {}, 0)
    dp, _ = train(m, DATA_PARALLEL, init, args.steps)
    mp, _ = train(m, MODEL_PARALLEL, init, args.steps)
    print("data-parallel  losses", np.round(dp, 5))
    print("model-parallel losses", np.round(mp, 5))
    half = args.steps // 2
    _, saved = train(m, DATA_PARALLEL, init, half)  # checkpoint under one layout
    resumed, state = train(m, MODEL_PARALLEL, saved, args.steps - half, half)
    print(f"data-parallel to step {half}, resumed model-parallel", np.round(resumed, 5))
    print("decode:", decode(m, state, b"Beautiful ")[0])
    print("beam search:", beam_decode(m, state)[0])
    # The planner plans the training step (its graph without the decoders'
    # while_loops); the rules it picks name dims, so they apply to m as well.
    step_only = build(mtf, decoding=False)
    plan = mtf.auto_layout(step_only["graph"], "all:4", outputs=[step_only["loss"]])
    planned, _ = train(m, ("all:4", str(plan.layout_rules)), init, args.steps)
    print(f"auto_layout chose {str(plan.layout_rules)!r}; losses", np.round(planned, 5))


if __name__ == "__main__":
    main()

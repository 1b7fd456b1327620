"""Mesh TF's Transformer package on mtf_core: loading it, its gin defaults, the
text, and the models of ``examples/mesh_tf_transformer.py``.

Each model is built twice, into two graphs: the training step (loss and
Adafactor updates) and the decoders (Mesh TF's ``while_loop``s).  Mesh TF
names variables by scope, so both graphs hold the same names and the weights
trained in one load into the other.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conformance.bootstrap import install_stand_ins  # noqa: E402
from conformance.run import fetch_wheel, unpack  # noqa: E402

BATCH, LENGTH, VOCAB = 8, 16, 128

#: Sizes on top of Mesh TF's ``transformer/gin/defaults.gin`` (6 layers of
#: d_model 1024 there): two layers, small enough for logical CPUs.
SIZES = ["num_layers = 2", "d_model = 32", "d_ff = 64", "num_heads = 8", "d_kv = 4"]
#: What makes the bitransformer T5-shaped (T5's own gin files set these): a
#: relative position bias shared by the layers of each stack instead of
#: absolute position embeddings.  The encoder and decoder stacks themselves
#: (self-attention, encoder-decoder attention, ReLU feed-forward, RMS norm,
#: dropout 0.1, shared embedding and softmax) are defaults.gin's.
T5_SHAPE = [
    f"{stack}/{binding}"
    for stack in ("encoder", "decoder")
    for binding in (
        "SelfAttention.relative_attention_type = 'bias_shared'",
        "SelfAttention.relative_attention_num_buckets = 32",
        "Unitransformer.positional_embedding = False",
    )
]


def mesh_tf_on_mtf_core() -> Any:
    """``mesh_tensorflow`` on mtf_core, its model packages (``transformer``,
    ``bert``, ...) loadable.

    They come from ``MTF_COMPAT_MESH_TF_PATH`` if set, else from the
    mesh-tensorflow 0.1.21 wheel in ``.cache/conformance`` (fetched from PyPI
    once, as ``make conformance`` does; Mesh TF's code is never committed).
    """
    install_stand_ins()  # TF 2.21 lacks the Estimator modules it imports
    import mtf_core.compat

    if not os.environ.get("MTF_COMPAT_MESH_TF_PATH"):
        cache = ROOT / ".cache" / "conformance"
        mesh_tf_dir, _ = unpack(fetch_wheel(cache), cache)
        mtf_core.compat.add_mesh_tf_path(mesh_tf_dir)
    import mesh_tensorflow

    return mesh_tensorflow


def load_mesh_tf() -> Any:
    """:func:`mesh_tf_on_mtf_core`, with Mesh TF's transformer package
    configured by its own ``defaults.gin`` (plus :data:`SIZES`, :data:`T5_SHAPE`).
    """
    mesh_tensorflow = mesh_tf_on_mtf_core()
    import gin
    from mesh_tensorflow.transformer import transformer

    defaults = Path(transformer.__file__).parent / "gin" / "defaults.gin"
    gin.clear_config()
    # skip_unknown: defaults.gin also configures utils.run (Mesh TF's
    # Estimator loop, not used here).
    gin.parse_config_files_and_bindings(
        [str(defaults)], SIZES + T5_SHAPE, skip_unknown=True
    )
    return mesh_tensorflow


def zen() -> np.ndarray:
    """The Zen of Python (``import this``'s text) as bytes."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing it prints it
        import this

    return np.frombuffer(codecs.decode(this.s, "rot13").encode(), np.uint8)


def text_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """``BATCH`` byte windows of the Zen and the window that follows each."""
    data = zen()
    starts = np.random.RandomState(step).randint(0, len(data) - 2 * LENGTH, BATCH)
    windows = [data[s : s + 2 * LENGTH] for s in starts]
    pairs = np.stack(windows).astype(np.int32)
    return pairs[:, :LENGTH], pairs[:, LENGTH:]


def encode(prompts: list[bytes]) -> np.ndarray:
    """Prompts as a ``[BATCH, LENGTH]`` batch of byte ids, 0-padded (Mesh TF's
    padding id), the last prompt repeated to fill the batch."""
    ids = np.zeros((BATCH, LENGTH), np.int32)
    for i in range(BATCH):
        prompt = prompts[min(i, len(prompts) - 1)][:LENGTH]
        ids[i, : len(prompt)] = np.frombuffer(prompt, np.uint8)
    return ids


def decode_bytes(ids: np.ndarray) -> bytes:
    """A row of ids as text (Mesh TF's end and padding ids dropped)."""
    return bytes(int(i) for i in ids if i > 1)


@dataclass
class Step:
    """A model's training graph: placeholders, loss and updates."""

    graph: Any
    mesh: Any
    inputs: list[Any]
    loss: Any
    updates: list[Any]


@dataclass
class Decoders:
    """A model's decoding graph: a prompt placeholder and named outputs."""

    graph: Any
    mesh: Any
    prompt: Any
    outputs: dict[str, Any] = field(default_factory=dict)


def _graph(mtf: Any) -> tuple[Any, Any, list[Any]]:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    shape = [mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)]
    return graph, mesh, shape


def _training_step(
    mtf: Any, model: Any, encoder: bool, sequence_id: bool = False
) -> Step:
    """Placeholders ``[inputs, targets]`` (``encoder``) or ``[targets]`` (an
    LM, whose inputs are its targets shifted right).  ``sequence_id``: mark
    the padding (id 0) as T5's packed data does, which Mesh TF's mixture of
    experts needs (its gating weighs each position by it)."""
    import tensorflow as tf
    from mesh_tensorflow.transformer import transformer

    graph, mesh, shape = _graph(mtf)
    targets = mtf.placeholder(mesh, shape, dtype=tf.int32)
    if encoder:
        inputs = mtf.placeholder(mesh, shape, dtype=tf.int32)
        feeds = [inputs, targets]
    else:
        inputs = transformer.autoregressive_inputs(targets)
        feeds = [targets]
    segments = {}
    if sequence_id:
        segments["sequence_id"] = mtf.cast(mtf.not_equal(targets, 0), tf.int32)
    # mode "train": defaults.gin's dropout (0.1) is on.
    _, loss = model.call_simple(
        inputs=inputs, targets=targets, compute_loss=True, mode="train", **segments
    )
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.AdafactorOptimizer(learning_rate=0.01).apply_grads(
        grads, variables
    )
    return Step(graph, mesh, feeds, loss, updates)


def language_model(mtf: Any, stack: dict[str, Any] | None = None, **model: Any) -> Any:
    """defaults.gin's LM: a ``Unitransformer`` on ``make_layer_stack(**stack)``
    (``model``: more of the ``Unitransformer``'s arguments)."""
    from mesh_tensorflow.transformer import transformer

    return transformer.Unitransformer(
        layer_stack=transformer.make_layer_stack(**(stack or {})),
        input_vocab_size=VOCAB,
        output_vocab_size=VOCAB,
        autoregressive=True,
        max_length=LENGTH,
        **model,
    )


def lm_step(mtf: Any) -> Step:
    """The LM learns to continue each window."""
    return _training_step(mtf, language_model(mtf), encoder=False)


def lm_variant_step(mtf: Any, recompute_grads: bool, reversible: bool) -> Step:
    """:func:`lm_step` with Mesh TF's ``LayerStack.recompute_grads`` (each
    layer through ``mtf.recompute_grad``, which makes the layer's weights
    inside the recomputed function and keeps dropout's forward masks) and/or
    its ``ReversibleLayerStack`` (a RevNet: each layer through
    ``mtf.layers.reversible_half_residual_and_swap``, whose backward pass
    rebuilds the layer's inputs from its outputs when recomputing)."""
    import gin
    from mesh_tensorflow.transformer import transformer

    with gin.unlock_config():
        gin.bind_parameter("LayerStack.recompute_grads", recompute_grads)
    try:
        stack = (
            {"layer_stack_cls": transformer.ReversibleLayerStack} if reversible else {}
        )
        return _training_step(mtf, language_model(mtf, stack), encoder=False)
    finally:
        with gin.unlock_config():
            gin.bind_parameter("LayerStack.recompute_grads", False)


def moe_lm_step(mtf: Any, mesh_shape: str, layout: str) -> Step:
    """The LM with Mesh TF's mixture of experts (``moe.MoE1D``: 16 experts,
    top-2 gating) in place of each feed-forward layer.  It is built for one
    layout: Mesh TF's MoE sizes its groups from the layout's split of the
    batch."""
    from mesh_tensorflow.transformer import moe, transformer_layers

    stack = {"layers": [transformer_layers.SelfAttention, moe.MoE1D]}
    model = language_model(mtf, stack, mesh_shape=mesh_shape, layout=layout)
    return _training_step(mtf, model, encoder=False, sequence_id=True)


def lm_decoders(mtf: Any) -> Decoders:
    """Greedy ``sample_autoregressive`` from the prompt and 2-beam
    ``beam_search`` (from empty prompts)."""
    import tensorflow as tf

    model = language_model(mtf)
    graph, mesh, shape = _graph(mtf)
    prompt = mtf.placeholder(mesh, shape, dtype=tf.int32)
    greedy = model.sample_autoregressive(prompt, temperature=0.0)
    beam = mtf.Dimension("beam", 2)
    empty = mtf.zeros(mesh, [shape[0], beam, shape[1]], dtype=tf.int32)
    beams = model.beam_search(empty, mtf.constant(mesh, LENGTH, dtype=tf.int32))
    return Decoders(graph, mesh, prompt, {"greedy": greedy, "beam search": beams})


def bitransformer() -> Any:
    """``transformer.make_bitransformer()`` with the gin configuration."""
    from mesh_tensorflow.transformer import transformer

    return transformer.make_bitransformer(
        input_vocab_size=VOCAB, output_vocab_size=VOCAB
    )


def bitransformer_step(mtf: Any) -> Step:
    """The encoder reads a window, the decoder writes the one after it."""
    return _training_step(mtf, bitransformer(), encoder=True)


def bitransformer_decoders(mtf: Any) -> Decoders:
    """``Bitransformer.decode``: 2-beam search and sampling at temperature 1."""
    import tensorflow as tf

    model = bitransformer()
    graph, mesh, shape = _graph(mtf)
    prompt = mtf.placeholder(mesh, shape, dtype=tf.int32)
    beams = model.decode(prompt, beam_size=2)
    samples = model.decode(prompt, temperature=1.0)
    return Decoders(graph, mesh, prompt, {"beam search": beams, "sample": samples})

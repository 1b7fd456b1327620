"""Mesh TensorFlow's own BERT, unchanged, pretrained on mtf_core.

    .venv/bin/python examples/mesh_tf_bert.py --steps 6 [--devices 4]

Loads Mesh TF's ``bert`` package (``bert.py`` and ``optimization.py``, from
the mesh-tensorflow 0.1.21 wheel fetched once into ``.cache/conformance``;
Mesh TF's code is never committed here) through :mod:`mtf_core.compat` and
builds the pretraining step as its ``run_pretraining.py`` does: features
imported with ``mtf.import_tf_tensor``, ``BertModel`` (dropout 0.1, its
defaults), the masked-LM and next-sentence losses, and
``optimization.create_optimizer`` (Adam with weight decay, linear warmup and
decay on TF1's global step, gradients clipped by global norm), lowered with
``mtf.Lowering`` in TF1 graph mode and run in a ``Session`` after
``copy_masters_to_slices``.  The same initial weights train under a
data-parallel, a model-parallel and a 2-D layout on 8 (or 4) logical CPUs;
the losses agree.

The text is the Zen of Python (``import this``), byte-level: each example is
two 8-byte halves, the second the true continuation or another window's
(the next-sentence label), with 3 bytes of each masked (id 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from mesh_tf_models import mesh_tf_on_mtf_core, zen  # noqa: E402

BATCH, HALF, MASKED, VOCAB = 8, 8, 3, 128
LENGTH = 2 * HALF


def load_bert() -> tuple[Any, Any, Any]:
    """``mesh_tensorflow`` on mtf_core and Mesh TF's ``bert`` and
    ``bert.optimization`` modules (:func:`mesh_tf_models.mesh_tf_on_mtf_core`
    says from where)."""
    mesh_tensorflow = mesh_tf_on_mtf_core()
    from mesh_tensorflow.bert import bert, optimization

    return mesh_tensorflow, bert, optimization


def features(step: int) -> dict[str, np.ndarray]:
    """One batch of ``run_pretraining.py``'s features from the Zen."""
    rng = np.random.RandomState(step)
    data = zen().astype(np.int32)
    starts = rng.randint(0, len(data) - 2 * LENGTH, BATCH)
    first = np.stack([data[s : s + HALF] for s in starts])
    follows = np.stack([data[s + HALF : s + LENGTH] for s in starts])
    elsewhere = np.stack([data[s + LENGTH : s + LENGTH + HALF] for s in starts])
    is_next = rng.randint(0, 2, BATCH).astype(np.int32)
    second = np.where(is_next[:, None] == 1, follows, elsewhere)
    ids = np.concatenate([first, second], axis=1)
    positions = np.stack(
        [np.sort(rng.choice(LENGTH, MASKED, replace=False)) for _ in range(BATCH)]
    ).astype(np.int32)
    labels = np.take_along_axis(ids, positions, axis=1)
    masked = ids.copy()
    np.put_along_axis(masked, positions, 0, axis=1)
    return {
        "input_ids": masked,
        "input_mask": np.ones((BATCH, LENGTH), np.int32),
        "segment_ids": (np.arange(LENGTH) >= HALF)
        .astype(np.int32)[None]
        .repeat(BATCH, 0),
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "masked_lm_weights": np.ones((BATCH, MASKED), np.float32),
        "next_sentence_labels": is_next,
    }


def pretrain(
    mtf: Any, bert: Any, optimization: Any, shape: str, layout: str, steps: int
) -> tuple[list[float], int]:
    """``steps`` pretraining steps under ``layout`` from TF's seed 0: the
    losses, and the mtf graph's operation count."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    with tf.Graph().as_default():
        tf1.set_random_seed(0)  # Mesh TF's initializers take TF's seed
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "bert_mesh")
        batch = mtf.Dimension("batch", BATCH)
        seq = mtf.Dimension("seq", LENGTH)
        pred = mtf.Dimension("max_pred_seq", MASKED)
        example = features(0)
        fed = {k: tf1.placeholder(v.dtype, v.shape, name=k) for k, v in example.items()}
        dims = {
            k: [batch, pred] if k.startswith("masked") else [batch, seq] for k in fed
        }
        dims["next_sentence_labels"] = [batch]
        mtf_in = {k: mtf.import_tf_tensor(mesh, fed[k], dims[k]) for k in fed}
        config = bert.BertConfig(
            vocab_size=VOCAB,
            d_model=32,
            num_blocks=2,
            attention_num_heads=4,
            feedforward_intermediate_size=64,
            max_position_embeddings=LENGTH,
        )
        model = bert.BertModel(
            config=config,
            is_training=True,
            input_ids=mtf_in["input_ids"],
            input_mask=mtf_in["input_mask"],
            token_type_ids=mtf_in["segment_ids"],
            layout=layout,
            mesh_shape=shape,
        )
        lm_loss, _, _ = model.get_masked_lm_output(
            mtf_in["masked_lm_positions"],
            mtf_in["masked_lm_ids"],
            mtf_in["masked_lm_weights"],
        )
        ns_loss, _, _ = model.get_next_sentence_output(mtf_in["next_sentence_labels"])
        total = mtf.anonymize(lm_loss + ns_loss)
        _, updates = optimization.create_optimizer(
            total + model.get_extra_loss(), 1e-3, 100, 2, optimizer="adam"
        )
        n = mtf.convert_to_shape(shape).size
        impl = mtf.PlacementMeshImpl(shape, layout, mtf.logical_devices(n))
        lowering = mtf.Lowering(graph, {mesh: impl})
        loss = tf1.to_float(lowering.export_to_tf_tensor(total))
        global_step = tf1.train.get_global_step()
        train_op = tf.group(
            [lowering.lowered_operation(op) for op in updates]
            + [tf1.assign_add(global_step, 1)]
        )
        to_slices = lowering.copy_masters_to_slices()
        losses = []
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(to_slices)
            for i in range(steps):
                feed = {fed[k]: v for k, v in features(i).items()}
                losses.append(float(sess.run([loss, train_op], feed)[0]))
        return losses, len(graph.operations)


def layouts(devices: int) -> dict[str, tuple[str, str]]:
    half = devices // 2
    return {
        "data-parallel": (f"all:{devices}", "batch:all"),
        "model-parallel": (f"all:{devices}", "heads:all;intermediate:all;vocab:all"),
        f"2-D b:2;m:{half}": (
            f"b:2;m:{half}",
            "batch:b;heads:m;intermediate:m;vocab:m",
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--devices", type=int, choices=(4, 8), default=8)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: expected at least 1")
    import tensorflow as tf

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices
    )
    mtf, bert, optimization = load_bert()
    for name, (shape, layout) in layouts(args.devices).items():
        losses, ops = pretrain(mtf, bert, optimization, shape, layout, args.steps)
        shown = " ".join(f"{v:.5f}" for v in losses)
        print(f"BERT: {name} ({layout}) losses [{shown}] ops {ops}")


if __name__ == "__main__":
    main()

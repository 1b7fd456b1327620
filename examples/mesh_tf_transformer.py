"""Mesh TensorFlow's own Transformer package, unchanged, trained on mtf_core.

    .venv/bin/python examples/mesh_tf_transformer.py --steps 4 [--devices 4]

Loads Mesh TF's ``transformer`` package (from the mesh-tensorflow 0.1.21
wheel, fetched once into ``.cache/conformance``; Mesh TF's code is never
committed here) through :mod:`mtf_core.compat`, configures it with its own
``gin/defaults.gin`` at a small size (:mod:`mesh_tf_models`) and, on 8 (or 4)
logical CPUs, for two models:

* a 2-layer language model (``Unitransformer``), and
* a 2-layer T5-shaped encoder-decoder (``make_bitransformer()``),

trains the same initial weights under a data-parallel and a model-parallel
layout (the losses agree; dropout included), checkpoints the data-parallel run
halfway and resumes it under the model-parallel layout, plans the training step
with ``mtf.auto_layout`` and trains under the plan, and decodes with Mesh TF's
own decoders (LM: greedy ``sample_autoregressive`` and ``beam_search``;
bitransformer: ``Bitransformer.decode`` with 2 beams and with sampling).  The
LM also trains model-parallel with its layers recomputed
(``LayerStack.recompute_grads``: the same losses) and as Mesh TF's
``ReversibleLayerStack``, its layers kept and rebuilt (the same losses as
each other), and with Mesh TF's mixture of experts (``moe.MoE1D``) in place
of its feed-forward layers, its batch alone or its batch and its experts
split over the devices (the same losses for the first steps; then float32
rounding flips a routing decision and they part: docs/compatibility.md).
The text is Python's own ``this`` module (the Zen of Python), byte-level.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import mesh_tf_models as models  # noqa: E402

from mtf_core.train.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402

Layout = tuple[str, str]  # (mesh shape, layout rules)

#: What each model decodes from: the LM continues a prefix, the
#: bitransformer reads a window of the Zen and writes what follows it.
PROMPTS = {
    "LM": [b"Beautiful is ", b"Errors should ", b"Now is "],
    "bitransformer": [b"Beautiful is bet", b"Errors should ne", b"Now is better th"],
}


def layouts(devices: int) -> dict[str, Layout]:
    """The two layouts every model trains under, on ``devices`` CPUs."""
    mesh = f"all:{devices}"
    return {
        "data-parallel": (mesh, "batch:all"),
        "model-parallel": (mesh, "heads:all;d_ff:all;vocab:all"),
    }


def compile_on(mtf: Any, graph: Any, mesh: Any, layout: Layout, *args: Any) -> Any:
    """``mtf.compile_function`` under ``layout`` on the first logical CPUs."""
    shape, rules = layout
    n = mtf.convert_to_shape(shape).size
    impl = mtf.PlacementMeshImpl(shape, rules, mtf.logical_devices(n))
    return mtf.compile_function(graph, {mesh: impl}, *args)


def run(fn: Any, step: models.Step, first: int, count: int) -> list[float]:
    """Steps ``first .. first+count-1`` of ``fn``; their losses."""
    fn.random_step = first  # dropout's masks are drawn per step number
    losses = []
    for i in range(first, first + count):
        batch = models.text_batch(i)[-len(step.inputs) :]
        losses.append(float(fn(*batch)[0]))
    return losses


def train(
    mtf: Any, step: models.Step, devices: int, steps: int
) -> tuple[dict[str, list[float]], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Losses per run, the weights after ``steps`` steps and the initial ones."""
    dp_layout, mp_layout = layouts(devices).values()
    args = _args(step)
    dp = compile_on(mtf, step.graph, step.mesh, dp_layout, *args)
    # Every run of this process starts from dp's values.
    init = dp.variables.to_dict()
    half = steps // 2
    losses = {"data-parallel": run(dp, step, 0, half)}
    with tempfile.TemporaryDirectory() as directory:
        # mtf_core's checkpoint holds full values: any layout can load it.
        path = save_checkpoint(directory, dp.random_step, dp.variables.to_dict())
        saved = load_checkpoint(path)
    losses["data-parallel"] += run(dp, step, half, steps - half)

    mp = compile_on(mtf, step.graph, step.mesh, mp_layout, *args)
    mp.variables.load_dict(init)
    losses["model-parallel"] = run(mp, step, 0, steps)
    mp.variables.load_dict(saved.values)
    losses[f"data-parallel to step {half}, resumed model-parallel"] = run(
        mp, step, saved.step, steps - saved.step
    )
    trained = mp.variables.to_dict()

    # The planner gets a 2-D mesh; its rules name dims, as ours do.
    planned_mesh = f"b:2;m:{devices // 2}"
    plan = mtf.auto_layout(step.graph, planned_mesh, outputs=[step.loss])
    rules = str(plan.layout_rules)
    fn = compile_on(mtf, step.graph, step.mesh, (planned_mesh, rules), *args)
    fn.variables.load_dict(init)
    losses[f"auto_layout on {planned_mesh} chose {rules!r}"] = run(fn, step, 0, steps)
    return losses, trained, init


def recomputed(
    mtf: Any, devices: int, steps: int, lm: models.Step, init: dict[str, np.ndarray]
) -> tuple[list[float], list[str]]:
    """The LM with its layers recomputed (``LayerStack.recompute_grads``),
    model-parallel from ``init`` (the weights ``lm``, the LM kept, trained
    from): its losses.  Then Mesh TF's
    ``ReversibleLayerStack``, its layers kept and rebuilt, from the kept
    run's first weights.  Lines to print: the reversible runs' losses and,
    per recomputed graph, its recomputed blocks and ops (against the kept
    graph's)."""
    mp_layout = layouts(devices)["model-parallel"]

    def trained(step: models.Step, start: dict[str, np.ndarray] | None) -> Any:
        fn = compile_on(mtf, step.graph, step.mesh, mp_layout, *_args(step))
        if start is not None:
            fn.variables.load_dict(start)
        return fn

    again = models.lm_variant_step(mtf, recompute_grads=True, reversible=False)
    losses = run(trained(again, init), again, 0, steps)
    rev_kept = models.lm_variant_step(mtf, recompute_grads=False, reversible=True)
    rev_again = models.lm_variant_step(mtf, recompute_grads=True, reversible=True)
    fn = trained(rev_kept, None)
    start = fn.variables.to_dict()
    rev = run(fn, rev_kept, 0, steps)
    rev_re = run(trained(rev_again, start), rev_again, 0, steps)
    lines = [
        f"reversible layers kept losses {_losses(rev)}",
        f"reversible layers recomputed losses {_losses(rev_re)}",
    ]
    for name, plain, step in (
        ("layers", lm, again),
        ("reversible layers", rev_kept, rev_again),
    ):
        ops = step.graph.operations
        blocks = sum(op.op_type == "CustomGradient" for op in ops)
        lines.append(
            f"{name} recomputed: {blocks} blocks, ops {len(ops)} "
            f"({len(plain.graph.operations)} kept)"
        )
    return losses, lines


def experts(mtf: Any, devices: int, steps: int) -> list[str]:
    """The LM with Mesh TF's mixture of experts, trained with the batch split
    over the devices and with the batch and the experts split over them
    (each built for its layout, from the first's initial weights): lines
    with their losses."""
    mesh = f"all:{devices}"
    start = None
    lines = []
    for name, rules in (
        ("data-parallel", "batch:all"),
        ("experts", "batch:all;experts:all"),
    ):
        step = models.moe_lm_step(mtf, mesh, rules)
        fn = compile_on(mtf, step.graph, step.mesh, (mesh, rules), *_args(step))
        if start is None:
            start = fn.variables.to_dict()
        fn.variables.load_dict(start)
        losses = run(fn, step, 0, steps)
        lines.append(f"mixture of experts, {name} ({rules}) losses {_losses(losses)}")
    return lines


def _args(step: models.Step) -> tuple[Any, ...]:
    return step.inputs, [step.loss], step.updates


def decode(
    mtf: Any,
    dec: models.Decoders,
    layout: Layout,
    weights: dict[str, np.ndarray],
    prompts: list[bytes],
) -> dict[str, list[bytes]]:
    """Each decoder's text for ``prompts`` (a beam search: its best beam)."""
    outputs = list(dec.outputs.values())
    fn = compile_on(mtf, dec.graph, dec.mesh, layout, [dec.prompt], outputs)
    names = {v.name for v in fn.variables.variables}
    fn.variables.load_dict({k: v for k, v in weights.items() if k in names})
    results = fn(models.encode(prompts))
    texts = {}
    for name, ids in zip(dec.outputs, results):
        rows = ids[:, 0] if ids.ndim == 3 else ids  # [batch, beam, length]
        texts[name] = [models.decode_bytes(r) for r in rows[: len(prompts)]]
    return texts


def _losses(values: list[float]) -> str:
    """``[l0 l1 ...]`` to 5 decimals; a long run as its first and last 4."""
    shown = [f"{v:.5f}" for v in values]
    if len(shown) > 8:
        shown = [*shown[:4], "...", *shown[-4:]]
    return "[" + " ".join(shown) + "]"


def report(name: str, losses: dict[str, list[float]], texts: dict[str, Any]) -> None:
    for run_name, values in losses.items():
        print(f"{name}: {run_name} losses {_losses(values)}")
    dp = np.array(losses["data-parallel"])
    gaps = [
        # a resumed run's losses are the data-parallel run's last ones
        f"{float(np.max(np.abs(v - dp[-len(v) :]) / dp[-len(v) :])):.1e}"
        for v in map(np.array, list(losses.values())[1:])
    ]
    print(f"{name}: largest relative difference from data-parallel:", *gaps)
    for decoder, outs in texts.items():
        print(f"{name}: {decoder}: {outs}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--devices", type=int, choices=(4, 8), default=8)
    parser.add_argument(
        "--seed", type=int, default=0, help="TensorFlow's seed: the initial weights"
    )
    args = parser.parse_args(argv)
    mtf = models.load_mesh_tf()
    # Mesh TF's initializers take no seed of their own: TensorFlow's global
    # seed makes a run's initial weights, and so its losses, repeatable.
    import tensorflow as tf

    tf.random.set_seed(args.seed)
    mp_layout = layouts(args.devices)["model-parallel"]
    for name, build_step, build_decoders in [
        ("LM", models.lm_step, models.lm_decoders),
        ("bitransformer", models.bitransformer_step, models.bitransformer_decoders),
    ]:
        step = build_step(mtf)
        losses, weights, init = train(mtf, step, args.devices, args.steps)
        if name == "LM":
            lm, lm_init = step, init
        dec = build_decoders(mtf)
        texts = decode(mtf, dec, mp_layout, weights, PROMPTS[name])
        report(name, losses, texts)
    # After both models, so that their initial weights (TF's seeded draws)
    # are those of a run without these.
    again, lines = recomputed(mtf, args.devices, args.steps, lm, lm_init)
    print(f"LM: model-parallel, layers recomputed losses {_losses(again)}")
    for line in lines + experts(mtf, args.devices, args.steps):
        print(f"LM: {line}")


if __name__ == "__main__":
    main()

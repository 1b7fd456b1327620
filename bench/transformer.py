"""Graph build, lowering and step time of the Transformer LM under the presets.

The LM is ``mtf_core.models.build_lm`` (pre-norm layers: layer norm, causal
self-attention, relu feed-forward; learned positions; softmax cross entropy)
at d_model 256, d_ff 1024, heads 8, d_kv 32, vocab 8192, batch 32, length 128,
with gradients and optimizer updates (SGD by default, as in the shared
Mesh TensorFlow comparison graph), on 8 logical CPU devices.  Each
configuration runs in a fresh process.  Columns:

* ops: operations in the mtf graph (forward, backward, updates).
* build: building the mtf graph in Python, gradients and updates included.
* variables: making the per-device slice variables.
* lower: tracing the compiled step (lowering every op onto 8 devices).
* first step: TensorFlow's graph optimization plus the first run.
* step: median of ``--steps`` further steps; tokens/s = batch x length / step.

``--mtf_layers N...`` also runs bench/baseline (the graph both libraries can build) with
Mesh TensorFlow 0.1.21 and with mtf_core on mesh x:2;y:4 in the same run, for
the side-by-side ratios (needs ``make bench-venv-mtf``).

    .venv/bin/python bench/transformer.py                       # 1..64 layers
    .venv/bin/python bench/transformer.py --layers 1 8 --presets 2d --no_write
    .venv/bin/python bench/transformer.py --layers 1 8 --mtf_layers 1 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
PRESETS = ["data-parallel", "model-parallel", "2d"]
SIZES = dict(d_model=256, d_ff=1024, heads=8, d_kv=32, vocab=8192, batch=32, length=128)


def child(layers: int, preset: str, steps: int, optimizer: str) -> dict:
    """Runs one configuration in this process; returns its timings."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np

    import mtf_core as mtf
    from mtf_core.models import TransformerConfig, build_lm
    from mtf_core.presets import resolve_layout

    devices = mtf.logical_devices(8)
    cfg = TransformerConfig(num_layers=layers, **SIZES)
    t0 = time.perf_counter()
    model = build_lm(cfg, optimizer=optimizer, learning_rate=1e-3)
    build_s = time.perf_counter() - t0
    choice = resolve_layout(preset, 8)
    impl = mtf.PlacementMeshImpl(choice.mesh_shape, choice.rules, devices)
    t0 = time.perf_counter()
    fn = mtf.compile_function(
        model.graph, {model.mesh: impl}, model.placeholders, [model.loss], model.updates
    )
    variables_s = time.perf_counter() - t0
    lower_s = fn.trace()
    rng = np.random.RandomState(0)
    tok = rng.randint(1, cfg.vocab, (cfg.batch, cfg.length + 1)).astype(np.int32)
    args = (tok[:, :-1], tok[:, 1:])
    t0 = time.perf_counter()
    first_loss = float(fn(*args)[0])
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = float(fn(*args)[0])
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    return {
        "layers": layers,
        "preset": preset,
        "mesh": str(choice.mesh_shape),
        "ops": len(model.graph.operations),
        "tf_ops": len(fn.concrete.graph.get_operations()),
        "build_s": build_s,
        "variables_s": variables_s,
        "lower_s": lower_s,
        "first_step_s": first_s,
        "step_s": step_s,
        "tokens_per_s": cfg.batch * cfg.length / step_s,
        "first_loss": first_loss,
        "loss": loss,
        "allreduce_bytes": float(fn.counters.get("allreduce", 0.0)),
    }


def run_child(
    layers: int, preset: str, steps: int, optimizer: str, timeout: int
) -> dict:
    from compare_mtf import run

    cmd = [
        sys.executable, __file__, "--child", "--layers", str(layers),
        "--presets", preset, "--steps", str(steps), "--optimizer", optimizer,
    ]  # fmt: skip
    return run(cmd, timeout)


def fmt(v: object, digits: int = 2) -> str:
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def table(rows: list[dict]) -> str:
    head = (
        "| layers | preset | mesh | ops | TF ops | build s | variables s | lower s "
        "| first step s | step s | tokens/s | loss |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        if "error" in r:
            if r["error"].startswith("exit -9"):  # the kernel's OOM killer
                r = {**r, "error": "killed (SIGKILL, out of memory)"}
            lines.append(
                f"| {r['layers']} | {r['preset']} | | | | | | | | {r['error']} | | |"
            )
            continue
        lines.append(
            f"| {r['layers']} | {r['preset']} | `{r['mesh']}` | {r['ops']} | {r['tf_ops']} "
            f"| {fmt(r['build_s'])} | {fmt(r['variables_s'])} | {fmt(r['lower_s'])} "
            f"| {fmt(r['first_step_s'])} | {fmt(r['step_s'], 3)} "
            f"| {r['tokens_per_s']:,.0f} | {fmt(r['loss'], 4)} |"
        )
    return head + "\n".join(lines)


def mtf_side_by_side(layers: list[int], steps: int, timeout: int) -> str:
    from compare_mtf import OURS, THEIRS, ratio, run
    from compare_mtf import fmt as cfmt

    head = (
        "| layers | MTF lower s | ours lower s | lower speed-up | MTF step s "
        "| ours step s | step speed-up | MTF loss | ours loss |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for n in layers:
        common = [
            "lower",
            "--layers",
            str(n),
            "--mesh",
            "x:2;y:4",
            "--steps",
            str(steps),
        ]
        common += ["--layout", "batch:x;d_ff:y;heads:y;vocab:y"]
        print(f"[mtf side by side] layers={n}: mesh-tensorflow ...", flush=True)
        theirs = run(THEIRS + common, timeout)
        print(f"    {theirs}\n[mtf side by side] layers={n}: mtf_core ...", flush=True)
        ours = run(OURS + common, timeout)
        print(f"    {ours}", flush=True)
        lines.append(
            f"| {n} | {cfmt(theirs.get('lower_s', theirs.get('error')))} "
            f"| {cfmt(ours.get('lower_s', ours.get('error')))} | {ratio(theirs, ours, 'lower_s')} "
            f"| {cfmt(theirs.get('step_s', '-'))} | {cfmt(ours.get('step_s', '-'))} "
            f"| {ratio(theirs, ours, 'step_s')} | {cfmt(theirs.get('loss', '-'))} "
            f"| {cfmt(ours.get('loss', '-'))} |"
        )
    return head + "\n".join(lines)


def report(
    args: argparse.Namespace, rows: list[dict], side_by_side: str, load: float
) -> str:
    cmd = "python bench/transformer.py " + " ".join(sys.argv[1:])
    text = (
        "## Transformer\n\n"
        "Graph build, lowering (trace) and training-step time of the Transformer LM "
        "(`mtf_core.models.build_lm`: d_model 256, d_ff 1024, heads 8, d_kv 32, "
        "vocab 8192, batch 32, length 128, gradients and updates) under the three "
        "presets; column meanings in `bench/transformer.py`.\n\n"
        f"Command: `{cmd}` ({time.strftime('%Y-%m-%d')}, 8 logical CPU devices on a "
        f"{os.cpu_count()}-core host, load average {load:.1f} when the run started, "
        f"optimizer {args.optimizer}).\n\n{table(rows)}\n"
    )
    text += (
        "\nReading the table: lowering time is almost all TensorFlow creating ops "
        "(about 8.5 TF ops per mtf op on 8 devices, made directly in the graph: "
        'docs/architecture.md, "The lowering"), so it grows linearly with '
        'layers.  "first step" is mostly TensorFlow\'s own graph optimization, '
        "which grows faster than the graph.  Each layer is about 175 mtf ops, of "
        "which the two layer norms with their gradients are about 100; the shared "
        "comparison graph below has no layer norm (about 85 ops per layer).  "
        "Steps are compute bound (the logits over vocab 8192 are about 52 GFLOP "
        "per step at any depth, each layer about 21 GFLOP; the embedding lowers "
        "as a lookup); the 8 logical devices share the host's cores, so "
        "model-parallel layouts pay for their activation allreduces without "
        "gaining hardware, and at 64 layers the model-parallel preset, which "
        "keeps every activation whole on all 8 devices, does not fit the host's "
        "memory.\n"
    )
    if side_by_side:
        text += (
            "\nSide by side with Mesh TensorFlow 0.1.21 in the same run (the shared "
            "graph of bench/baseline: no layer norm, SGD; mesh `x:2;y:4`, layout "
            "`batch:x;d_ff:y;heads:y;vocab:y`):\n\n" + side_by_side + "\n"
        )
    return text


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--presets", nargs="+", default=PRESETS)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument(
        "--mtf_layers",
        type=int,
        nargs="*",
        default=[],
        help="also run the Mesh TensorFlow comparison at these depths",
    )
    ap.add_argument("--no_write", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(
            json.dumps(
                child(args.layers[0], args.presets[0], args.steps, args.optimizer)
            )
        )
        return
    from common import replace_section

    rows: list[dict] = []
    load = os.getloadavg()[0]
    side = ""
    if args.mtf_layers:
        side = mtf_side_by_side(args.mtf_layers, args.steps, args.timeout)
    for layers in args.layers:
        for preset in args.presets:
            print(f"[transformer] layers={layers} preset={preset} ...", flush=True)
            r = run_child(layers, preset, args.steps, args.optimizer, args.timeout)
            r.setdefault("layers", layers)
            r.setdefault("preset", preset)
            print(f"    {r}", flush=True)
            rows.append(r)
            if not args.no_write:  # after every row: a long run keeps what it has
                replace_section("transformer", report(args, rows, side, load))
    print(report(args, rows, side, load))


if __name__ == "__main__":
    main()

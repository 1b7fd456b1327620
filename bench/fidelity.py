"""Fidelity of the cost model: predicted against measured step times.

For each workload and mesh it takes at least ``--layouts`` valid layouts (the
planner's top-k under the profile, the data-parallel / model-parallel / 2-D
presets where they apply, then random valid layouts), predicts each one's
step with ``cost_models.evaluate`` on the given hardware profile (one rate set
per backend), measures each one's step on 8 logical CPU devices (a fresh
process per layout, both backends in it: a warm-up step, then the fastest of
``--steps``), and reports per workload, mesh and backend:

* rho: Spearman rank correlation of predicted and measured times;
* regret: measured time of the layout predicted fastest / measured best;
* top-3: whether the measured best is among the 3 predicted fastest;
* within 25%: the fraction of layouts whose predicted time is within 25% of
  the measured one, and the median and worst ``predicted / measured``.

Workloads: ``lm`` (the 2-layer Transformer LM of the README: d_model 256,
d_ff 1024, 8 heads, vocab 8192, batch 32, length 128), ``mlp`` (3 hidden
layers of 1024, 512 features, batch 4096) and ``wide`` (2 layers, d_model
1024, d_ff 4096, 16 heads, vocab 4096, batch 8, length 64), all trained
with Adam.

    .venv/bin/python bench/fidelity.py --hardware profile.json            # all
    .venv/bin/python bench/fidelity.py --hardware profile.json --workloads lm \\
        --meshes all:8 --backends placement --layouts 10 --no_write
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

Row = dict[str, Any]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
MESHES = ["all:8", "x:2;y:4", "x:2;y:2;z:2"]
BACKENDS = ["placement", "spmd"]
WORKLOADS = ["lm", "mlp", "wide"]
PRESETS = ["data-parallel", "model-parallel", "2d"]


def build(workload: str) -> Any:
    """The workload's training graph (Adam)."""
    from mtf_core.models import (
        MlpConfig,
        TransformerConfig,
        build_lm,
        build_mlp_classifier,
    )

    if workload == "lm":
        cfg = TransformerConfig(
            num_layers=2,
            d_model=256,
            heads=8,
            d_kv=32,
            d_ff=1024,
            vocab=8192,
            batch=32,
            length=128,
        )
        return build_lm(cfg, optimizer="adam", learning_rate=1e-3)
    if workload == "mlp":
        mcfg = MlpConfig(
            batch=4096, features=512, hidden=1024, classes=16, num_hidden_layers=3
        )
        return build_mlp_classifier(mcfg, optimizer="adam", learning_rate=1e-3)
    if workload == "wide":
        cfg = TransformerConfig(
            num_layers=2,
            d_model=1024,
            heads=16,
            d_kv=64,
            d_ff=4096,
            vocab=4096,
            batch=8,
            length=64,
        )
        return build_lm(cfg, optimizer="adam", learning_rate=1e-3)
    raise SystemExit(f"unknown workload {workload!r}; expected one of {WORKLOADS}")


def feeds(model: Any) -> list[Any]:
    """Random inputs of the right shapes and dtypes for the placeholders."""
    import numpy as np

    rng = np.random.RandomState(0)
    out = []
    for t in model.placeholders:
        shape = t.shape.to_integer_list()
        if t.dtype.startswith("int"):
            hi = max(d.size for d in t.shape) if t.shape.ndims else 2
            hi = getattr(model.config, "vocab", None) or getattr(
                model.config, "classes", hi
            )
            out.append(rng.randint(0, hi, shape).astype(t.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(t.dtype))
    return out


def child(
    workload: str, mesh: str, rules: str, backends: str, steps: int
) -> dict[str, Row]:
    """Measures one layout's step on each backend (comma-separated) in this
    process: per backend the fastest of ``steps`` steps after a warm-up, in
    wall seconds and in CPU seconds / usable cores (see ``--clock``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import mtf_core as mtf
    from mtf_core.lowering.calibrate import usable_cores

    cores = usable_cores(8)
    out = {}
    for backend in backends.split(","):
        model = build(workload)
        devices = mtf.logical_devices(8)
        if backend == "spmd":
            impl: Any = mtf.SimdMeshImpl(mesh, rules, devices)
        else:
            impl = mtf.PlacementMeshImpl(mesh, rules, devices)
        fn = mtf.compile_function(
            model.graph,
            {model.mesh: impl},
            model.placeholders,
            [model.loss],
            model.updates,
        )
        args = feeds(model)
        fn(*args)
        wall, cpu = [], []
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(*args)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out[backend] = {"wall_s": min(wall), "cpu_s": min(cpu) / cores}
    return out


def measure(
    workload: str,
    mesh: str,
    rules: str,
    backends: list[str],
    steps: int,
    processes: int = 1,
) -> dict[str, Row]:
    """One layout's fastest steps, each clock's fastest over ``processes``
    fresh processes (a layout's step moves by up to ~10% from one fresh
    process to the next on this host)."""
    runs = [
        _measure_once(workload, mesh, rules, backends, steps) for _ in range(processes)
    ]
    return {
        b: {
            "wall_s": min(r[b]["wall_s"] for r in runs),
            "cpu_s": min(r[b]["cpu_s"] for r in runs),
            "processes": processes,
        }
        for b in backends
    }


def _measure_once(
    workload: str, mesh: str, rules: str, backends: list[str], steps: int
) -> dict[str, Row]:
    """One layout's fastest steps, in a fresh process."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        workload,
        mesh,
        rules,
        ",".join(backends),
        str(steps),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    result: dict[str, Row] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def candidate_layouts(
    model: Any, mesh: str, hw: Any, count: int, seed: int
) -> list[tuple[str, str]]:
    """``[(source, rules)]``: planner top-k, presets, then random valid ones."""
    import mtf_core as mtf
    from cost_models.costs import evaluate
    from mtf_core.errors import MtfError
    from mtf_core.shapes import convert_to_shape

    out: dict[str, str] = {}

    def valid(rules: str) -> bool:
        try:
            cost = evaluate(model.graph, mesh, rules, hw, outputs=[model.loss])
        except MtfError:
            return False
        return cost.fits

    plan = mtf.auto_layout(
        model.graph, mesh, outputs=[model.loss], hardware=hw, top_k=max(1, count // 2)
    )
    for c in plan.candidates:
        out.setdefault(str(c.layout_rules), f"planner#{c.rank}")
    for b in plan.baselines:
        rules = None if b.layout_rules is None else str(b.layout_rules)
        if rules is not None and valid(rules):
            out.setdefault(rules, b.name)
    names = sorted(_splittable_dims(model.graph))
    rng = random.Random(seed)
    axes = convert_to_shape(mesh).dimension_names
    tries = 0
    while len(out) < count and tries < 5000:
        tries += 1
        picks = rng.sample(names + [None] * len(axes), len(axes))
        rules = ";".join(f"{d}:{a}" for d, a in zip(picks, axes) if d is not None)
        if rules not in out and valid(rules):
            out[rules] = "random"
    # One dim per axis may give too few (a 1-D mesh has one per dim): then
    # put two or three dims on an axis.
    tries = 0
    while len(out) < count and tries < 5000:
        tries += 1
        pool = rng.sample(names, len(names))
        parts = []
        for a in axes:
            k = rng.choice((0, 1, 2, 3))
            parts += [f"{d}:{a}" for d in sorted(pool[:k])]
            pool = pool[k:]
        rules = ";".join(parts)
        if rules not in out and valid(rules):
            out[rules] = "random"
    return [(src, r) for r, src in out.items()]


def _splittable_dims(graph: Any) -> set[str]:
    names: set[str] = set()
    blocked: set[str] = set()
    for op in graph.operations:
        names |= set(op.all_dim_names)
        blocked |= set(op.unsplittable_dims())
    return names - blocked


def metrics(pred: list[float], meas: list[float]) -> dict[str, float]:
    """Rank correlation, regret, top-3 hit and error of ``pred`` against ``meas``."""
    from scipy.stats import spearmanr

    rho = float(spearmanr(pred, meas).statistic) if len(pred) > 2 else float("nan")
    order = sorted(range(len(pred)), key=lambda i: pred[i])
    best = min(meas)
    ratios = [p / m for p, m in zip(pred, meas)]
    return {
        "rho": rho,
        "regret": meas[order[0]] / best,
        "top3": float(meas.index(best) in order[:3]),
        "within25": sum(abs(r - 1) <= 0.25 for r in ratios) / len(ratios),
        "median_ratio": sorted(ratios)[len(ratios) // 2],
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hardware", help="calibrated profile (.json); required")
    p.add_argument("--workloads", nargs="+", default=WORKLOADS)
    p.add_argument("--meshes", nargs="+", default=MESHES)
    p.add_argument("--backends", nargs="+", default=BACKENDS)
    p.add_argument("--layouts", type=int, default=10, help="layouts per mesh (>= 10)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per layout")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh processes per layout (the fastest of each clock is kept)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write every row here")
    p.add_argument("--jobs", type=int, default=1, help="layouts measured at once")
    p.add_argument("--no_write", action="store_true", help="leave the docs alone")
    p.add_argument("--child", nargs=5, metavar=("W", "MESH", "RULES", "B", "N"))
    p.add_argument(
        "--render", nargs="+", metavar="JSON", help="only tabulate rows of earlier runs"
    )
    p.add_argument("--machine", help="with --render: the machine line to print")
    p.add_argument("--note", default="", help="a paragraph to add to the docs section")
    p.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="which measured time the main columns (and the learned profile) use",
    )
    args = p.parse_args()
    if args.child:
        w, mesh, rules, backend, n = args.child
        print(json.dumps(child(w, mesh, rules, backend, int(n))))
        return
    if args.render:
        from common import machine_summary

        rows = [r for path in args.render for r in json.loads(Path(path).read_text())]
        hw = None
        if args.hardware:  # price the measured layouts again on this profile
            from cost_models.profiles import get_hardware

            hw = get_hardware(args.hardware)
            rows = reprice(rows, hw)
        render(rows, args, args.machine or machine_summary(), hw)
        return
    if not args.hardware:
        p.error("--hardware is required (a profile from mtf-planner calibrate)")
    if args.processes < 1:
        p.error(f"--processes {args.processes}: expected at least 1")
    from common import machine_summary

    from cost_models.costs import evaluate
    from cost_models.profiles import get_hardware

    machine = machine_summary()
    hw = get_hardware(args.hardware)
    tasks = []
    for w in args.workloads:
        model = build(w)
        for mesh in args.meshes:
            for src, rules in candidate_layouts(
                model, mesh, hw, args.layouts, args.seed
            ):
                preds = {
                    b: evaluate(
                        model.graph,
                        mesh,
                        rules,
                        hw.for_backend(b),
                        outputs=[model.loss],
                    ).time_s
                    for b in args.backends
                }
                tasks.append((w, mesh, src, rules, preds))
    print(f"{len(tasks)} layouts, {machine}", flush=True)

    def run(task: tuple[str, str, str, str, dict[str, float]]) -> list[Row]:
        w, mesh, src, rules, preds = task
        got = measure(w, mesh, rules, args.backends, args.steps, args.processes)
        rows = [
            dict(
                workload=w,
                mesh=mesh,
                backend=b,
                source=src,
                rules=rules,
                predicted_s=preds[b],
                **got[b],
            )
            for b in args.backends
        ]
        for r in rows:
            print(
                f"{w:5s} {mesh:12s} {r['backend']:9s} {src:16s} {rules:44s} pred "
                f"{r['predicted_s'] * 1e3:7.1f} ms  cpu {r['cpu_s'] * 1e3:7.1f} ms  "
                f"wall {r['wall_s'] * 1e3:7.1f} ms",
                flush=True,
            )
        return rows

    measured: list[Row] = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for rs in pool.map(run, tasks):
            measured.extend(rs)
            if args.json:  # as it goes: a long run interrupted keeps its rows
                Path(args.json).write_text(json.dumps(measured, indent=1))
    render(measured, args, machine, hw)


def reprice(rows: list[Row], hw: Any) -> list[Row]:
    """``rows`` with ``predicted_s`` from ``hw`` (per backend)."""
    from cost_models.costs import evaluate

    models: dict[str, Any] = {}
    out = []
    for r in rows:
        m = models.setdefault(r["workload"], build(r["workload"]))
        cost = evaluate(
            m.graph, r["mesh"], r["rules"], hw.for_backend(r["backend"]), [m.loss]
        )
        out.append(dict(r, predicted_s=cost.time_s))
    return out


def learned(rows: list[Row], hw: Any, clock: str = "cpu") -> list[Row]:
    """``rows`` predicted by ``hw`` refitted, per backend, from the measured
    steps (``clock``: ``cpu`` or ``wall``) of the *other* workloads
    (``cost_models.calibration.refit``: what the service does with reported
    runs), never from the workload's own."""
    from cost_models.calibration import refit, step_features
    from cost_models.costs import evaluate

    models = {w: build(w) for w in dict.fromkeys(r["workload"] for r in rows)}
    feats = [
        step_features(
            models[r["workload"]].graph,
            r["mesh"],
            r["rules"],
            [models[r["workload"]].loss],
        )
        for r in rows
    ]
    out = []
    for w in models:
        for b in dict.fromkeys(r["backend"] for r in rows):
            train = [
                (f, r[f"{clock}_s"])
                for f, r in zip(feats, rows)
                if r["workload"] != w and r["backend"] == b
            ]
            fitted = refit(hw.for_backend(b), train, backend=b)
            for r in rows:
                if r["workload"] == w and r["backend"] == b:
                    m = models[w]
                    cost = evaluate(m.graph, r["mesh"], r["rules"], fitted, [m.loss])
                    out.append(dict(r, predicted_s=cost.time_s))
    return out


CLOCKS = {
    "cpu": (
        "The main columns use the CPU clock (the step's process CPU seconds\n"
        "divided by the 2 cores the 8 logical devices share: what the wall time is\n"
        "on an otherwise idle host, since the devices keep both cores busy); the\n"
        "last column is the wall clock, which on a shared host (other jobs\n"
        "running, load average in the machine line) measures the other jobs as\n"
        "much as the step."
    ),
    "wall": (
        "The main columns use the wall clock (what a user waits for; the host\n"
        "ran nothing else, load average in the machine line); the last column is\n"
        "the CPU clock (the step's process CPU seconds divided by the 2 cores the\n"
        "8 logical devices share)."
    ),
}

EXPLAIN = """\
Predicted: `cost_models.evaluate` on the calibrated profile, per backend
(`hw.for_backend`).  Measured: each layout in a fresh process (both backends
in it, one after the other), a warm-up step, then the fastest of the timed
steps (with `--processes N`, the fastest of N such processes).  {clocks}  rho: Spearman rank correlation of predicted and measured; regret:
measured time of the layout predicted fastest over the measured best; top-3
hit: the measured best is among the 3 predicted fastest; within 25%: the
share of layouts whose prediction is within 25% of the measurement.  Layouts:
the planner's top 5 on the profile, the planner's baselines (replicated,
data-parallel, ...) where they apply, then random valid layouts.
"""


def _table(rows: list[Row], clock: str = "cpu") -> str:
    from common import markdown_table

    other = "wall" if clock == "cpu" else "cpu"

    table = []
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["mesh"], r["backend"]), []).append(r)
    for (w, mesh, b), sel in groups.items():
        pred = [r["predicted_s"] for r in sel]
        m = metrics(pred, [r[f"{clock}_s"] for r in sel])
        mw = metrics(pred, [r[f"{other}_s"] for r in sel])
        table.append(
            [
                w,
                mesh,
                b,
                len(sel),
                f"{m['rho']:.2f}",
                f"{m['regret']:.2f}",
                "yes" if m["top3"] else "no",
                f"{m['within25']:.0%}",
                f"{m['median_ratio']:.2f} ({m['min_ratio']:.2f}-{m['max_ratio']:.2f})",
                f"{mw['rho']:.2f} / {mw['regret']:.2f} / {mw['within25']:.0%}",
            ]
        )
    headers = [
        "workload",
        "mesh",
        "backend",
        "layouts",
        "Spearman rho",
        "regret",
        "top-3 hit",
        "within 25%",
        "predicted / measured: median (range)",
        f"{other} clock: rho / regret / within 25%",
    ]
    return markdown_table(headers, table)


def render(rows: list[Row], args: argparse.Namespace, machine: str, hw: Any) -> None:
    """Prints the tables of ``rows`` and writes them into docs/benchmarks.md:
    as calibrated, and (with several workloads) after learning from the
    other workloads' measured runs."""
    from common import command_line, replace_section

    clock = args.clock
    text = f"Calibrated profile (the sweep only), {clock} clock:\n\n" + _table(
        rows, clock
    )
    if hw is not None and len({r["workload"] for r in rows}) > 1:
        text += (
            "\n\nAfter learning from runs: the profile refitted, per backend, "
            "from the measured steps of the *other* workloads (as the service "
            "refits from reported runs), then predicting this one:\n\n"
            + _table(learned(rows, hw, clock), clock)
        )
    print(text)
    if not args.no_write:
        name = hw.name if hw is not None else ""
        cmd = command_line()
        if args.render:  # the rows' files, not the notes given with them
            files = " ".join(args.render)
            cmd = (
                f".venv/bin/python bench/fidelity.py --render {files} --hardware "
                f"{args.hardware} --clock {clock}"
            )
        body = (
            f"{machine}; profile `{name}`.\n\n    {cmd}\n\n{text}\n\n"
            + EXPLAIN.format(clocks=CLOCKS[clock])
            + (f"\n{args.note}\n" if args.note else "")
        )
        replace_section("fidelity", body, title="Cost model fidelity")


if __name__ == "__main__":
    main()

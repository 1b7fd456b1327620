"""Side by side with Mesh TensorFlow 0.1.21, measured in one run.

Builds the same Transformer LM training graph (bench/baseline/graph_common.py)
with both libraries, each in its own environment, and compares lowering time,
training-step time and auto-layout planning time as ratios.

  make bench-venv-mtf            # once: .venv-mtf with mesh-tensorflow 0.1.21
  .venv/bin/python bench/compare_mtf.py lower --layers 1 8
  .venv/bin/python bench/compare_mtf.py auto --layers 8 64 128 --meshes "x:2;y:4" "x:2;y:2;z:2"

``auto`` runs each measurement in a fresh process (its start is not timed)
that has loaded TensorFlow and built the graph; the clock covers importing
the planner and its solver (OR-tools) and the one call: Mesh TensorFlow's
``auto_mtf.layout``, ours (the same call), and ours ``mtf.auto_layout`` with
its defaults.  See bench/baseline/run_ours.py and run_mtf.py.

Results go to docs/benchmarks.md between the markers of the section
"Side by side with Mesh TensorFlow".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import time
from pathlib import Path

from common import command_line, replace_section

ROOT = Path(__file__).resolve().parent.parent
OURS = [str(ROOT / ".venv/bin/python"), str(ROOT / "bench/baseline/run_ours.py")]
THEIRS = [str(ROOT / ".venv-mtf/bin/python"), str(ROOT / "bench/baseline/run_mtf.py")]


def run(cmd: list[str], timeout_s: int) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        return {"error": f"exit {proc.returncode}: {tail[0][:120]}"}
    result = json.loads(lines[-1])
    result["wall_s"] = time.perf_counter() - t0
    return result


def ratio(theirs: dict, ours: dict, key: str) -> str:
    if key in theirs and key in ours:
        return f"{theirs[key] / ours[key]:.1f}x"
    return "n/a"


def speedup(theirs: dict, ours: dict) -> str:
    if "plan_s" in theirs and "plan_s" in ours:
        return f"{theirs['plan_s'] / ours['plan_s']:.0f}x"
    return "n/a"


def mtf_rules(text: str) -> str:
    """Mesh TensorFlow's ``LayoutRules{('d', 'x'), ...}`` (a set, printed in
    hash order) as ``d:x;...`` in name order, like ours."""
    pairs = re.findall(r"\('([^']+)', '([^']+)'\)", text)
    return ";".join(f"{d}:{m}" for d, m in sorted(pairs)) if pairs else text


def fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("mode", choices=["lower", "auto"])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--meshes", nargs="+", default=["x:2;y:4"])
    ap.add_argument("--layout", default="batch:x;d_ff:y;heads:y;vocab:y")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    rows = []
    for mesh in args.meshes:
        for layers in args.layers:
            common = [args.mode, "--layers", str(layers), "--mesh", mesh]
            if args.mode == "lower":
                common += ["--layout", args.layout, "--steps", str(args.steps)]
            print(
                f"[{args.mode}] layers={layers} mesh={mesh}: mesh-tensorflow ...",
                flush=True,
            )
            theirs = run(THEIRS + common, args.timeout)
            print(f"    {theirs}", flush=True)
            calls = ["auto_mtf", "auto_layout"] if args.mode == "auto" else [None]
            ours = {}
            for call in calls:
                print(
                    f"[{args.mode}] layers={layers} mesh={mesh}: mtf-planner "
                    f"{call or ''} ...",
                    flush=True,
                )
                extra = ["--call", call] if call else []
                ours[call] = run(OURS + common + extra, args.timeout)
                print(f"    {ours[call]}", flush=True)
            rows.append((layers, mesh, theirs, ours))
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if args.mode == "lower":
        head = "| layers | mesh | MTF lower s | ours lower s | lower speed-up | MTF step s | ours step s | step speed-up | MTF loss | ours loss |\n|---|---|---|---|---|---|---|---|---|---|\n"
        lines = []
        for layers, mesh, t, by_call in rows:
            o = by_call[None]
            lines.append(
                f"| {layers} | `{mesh}` | {fmt(t.get('lower_s', t.get('error')))} | {fmt(o.get('lower_s', o.get('error')))} | {ratio(t, o, 'lower_s')} "
                f"| {fmt(t.get('step_s', '-'))} | {fmt(o.get('step_s', '-'))} | {ratio(t, o, 'step_s')} | {fmt(t.get('loss', '-'))} | {fmt(o.get('loss', '-'))} |"
            )
        body = head + "\n".join(lines)
    else:
        head = (
            "| layers | mesh | MTF `auto_mtf.layout` s | ours, same call s | "
            "speed-up | ours `mtf.auto_layout` (defaults) s | speed-up | "
            "MTF rules | our rules (memory; time) | ours (defaults) |\n"
            "|---|---|---:|---:|---:|---:|---:|---|---|---|\n"
        )
        lines = []
        for layers, mesh, t, by_call in rows:
            same, full = by_call["auto_mtf"], by_call["auto_layout"]
            lines.append(
                f"| {layers} | `{mesh}` | {fmt(t.get('plan_s', t.get('error')))} "
                f"| {fmt(same.get('plan_s', same.get('error')))} "
                f"| {speedup(t, same)} "
                f"| {fmt(full.get('plan_s', full.get('error')))} "
                f"| {speedup(t, full)} "
                f"| `{mtf_rules(t.get('rules', '-'))}` "
                f"| `{same.get('rules', '-')}`; `{full.get('rules', '-')}` "
                f"| {full.get('status', '-')}, gap {full.get('gap', '-')}, "
                f"{full.get('candidates', '-')} candidates, "
                f"verified {full.get('verified', '-')}, "
                f"{full.get('solves', '-')} solves, in {full.get('solved_in', '-')} "
                f"({full.get('ortools_loaded', '-')}) |"
            )
        body = head + "\n".join(lines)
    cmd = command_line()
    section = f"mtf-{args.mode}"
    load = ""
    if load_before is not None and load_after is not None:
        load = (
            f"; load average {load_before:.1f} when it started, "
            f"{load_after:.1f} when it ended, on {os.cpu_count()} cores"
        )
    text = (
        f"Command: `{cmd}` (same machine, same run; "
        f"{time.strftime('%Y-%m-%d')}{load}).\n\n{body}\n"
    )
    print(text)
    if not args.no_write:
        replace_section(section, text)


if __name__ == "__main__":
    main()

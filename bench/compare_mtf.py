"""Side by side with Mesh TensorFlow 0.1.21, measured in one run.

Builds the same Transformer LM training graph (bench/baseline/graph_common.py)
with both libraries, each in its own environment, and compares lowering time,
training-step time and auto-layout planning time as ratios.

  make bench-venv-mtf            # once: .venv-mtf with mesh-tensorflow 0.1.21
  .venv/bin/python bench/compare_mtf.py lower --layers 1 8
  .venv/bin/python bench/compare_mtf.py auto --layers 8 32 64 --meshes "x:2;y:4" "x:2;y:2;z:2"

Results go to docs/benchmarks.md between the markers of the section
"Side by side with Mesh TensorFlow".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import replace_section

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
            print(
                f"[{args.mode}] layers={layers} mesh={mesh}: mtf-planner ...",
                flush=True,
            )
            ours = run(OURS + common, args.timeout)
            print(f"    {ours}", flush=True)
            rows.append((layers, mesh, theirs, ours))
    if args.mode == "lower":
        head = "| layers | mesh | MTF lower s | ours lower s | lower speed-up | MTF step s | ours step s | step speed-up | MTF loss | ours loss |\n|---|---|---|---|---|---|---|---|---|---|\n"
        lines = []
        for layers, mesh, t, o in rows:
            lines.append(
                f"| {layers} | `{mesh}` | {fmt(t.get('lower_s', t.get('error')))} | {fmt(o.get('lower_s', o.get('error')))} | {ratio(t, o, 'lower_s')} "
                f"| {fmt(t.get('step_s', '-'))} | {fmt(o.get('step_s', '-'))} | {ratio(t, o, 'step_s')} | {fmt(t.get('loss', '-'))} | {fmt(o.get('loss', '-'))} |"
            )
        body = head + "\n".join(lines)
    else:
        head = "| layers | mesh | MTF auto_mtf s | ours s | speed-up | MTF rules | our rules (objective memory) | ours status / gap |\n|---|---|---|---|---|---|---|---|\n"
        lines = []
        for layers, mesh, t, o in rows:
            sp = (
                f"{t['plan_s'] / o['plan_s']:.0f}x"
                if "plan_s" in t and "plan_s" in o
                else "n/a"
            )
            lines.append(
                f"| {layers} | `{mesh}` | {fmt(t.get('plan_s', t.get('error')))} | {fmt(o.get('plan_s', o.get('error')))} | {sp} "
                f"| `{t.get('rules', '-')}` | `{o.get('rules', '-')}` | {o.get('status', '-')} / {o.get('gap', '-')} |"
            )
        body = head + "\n".join(lines)
    cmd = "python bench/compare_mtf.py " + " ".join(sys.argv[1:])
    section = f"mtf-{args.mode}"
    text = f"Command: `{cmd}` (same machine, same run; {time.strftime('%Y-%m-%d')}).\n\n{body}\n"
    print(text)
    if not args.no_write:
        replace_section(section, text)


if __name__ == "__main__":
    main()

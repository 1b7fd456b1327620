"""The scale search's planning time in a program that imported TensorFlow.

A program that lowers its plan has TensorFlow loaded when it plans.  The
search then runs in one process: forking workers beside TensorFlow's threads
is not safe (``layout_planner.scale_workers.fork_is_safe``), so
``plan_transformer`` lays every mesh out itself, and OR-tools is imported
after TensorFlow (``RTLD_DEEPBIND``, docs/planner.md).  This plans each
reference model of ``bench/scale.py`` in a fresh interpreter that imported
TensorFlow first (its import not timed), and, in turn, in one that did not
(the setting of ``bench/scale.py``, workers forked), and prints both: the
first is what such a program lives through.  ``--write`` puts the table in
docs/benchmarks.md, section ``scale-after-tf``.

    .venv/bin/python bench/scale_after_tf.py [--runs 3] [--only gpt3,...] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (  # noqa: E402
    ROOT,
    child_json,
    command_line,
    machine_summary,
    markdown_table,
    replace_section,
)
from bench.scale import selected  # noqa: E402

# Run in a fresh interpreter; argv: root, case key, "tf" or "".
_CHILD = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, sys.argv[1])
if sys.argv[3] == "tf":
    import tensorflow  # what the program did before it planned
from bench.scale import CASES
from layout_planner.choices import plan_transformer
from layout_planner.scale_workers import default_workers
case = next(c for c in CASES if c.key == sys.argv[2])
start = time.perf_counter()
plan = plan_transformer(case.config, case.devices, case.hardware,
                        encoder_decoder=case.encoder_decoder)
print(json.dumps({"seconds": time.perf_counter() - start,
                  "workers": default_workers(), "step": plan.step_time_s}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per model and setting")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if not 1 <= args.runs <= 20:
        ap.error(f"--runs {args.runs}: expected 1 to 20")
    cases = selected(args.only)
    if not cases:
        ap.error(f"--only {args.only!r} names no case")
    machine = machine_summary()
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for case in cases:
            for setting in ("tf", ""):
                r = child_json(
                    _CHILD, [str(ROOT), case.key, setting], f"{case.key} {setting}"
                )
                got.setdefault((case.key, setting), []).append(r)
                print(
                    f"run {run + 1}/{args.runs} {case.key} "
                    f"{'after TensorFlow' if setting else 'without'}: "
                    f"{r['seconds']:.2f} s on {r['workers']} process(es)",
                    flush=True,
                )
    headers = [
        "model", "after TensorFlow: median s", "processes", "all runs",
        "without TensorFlow: median s", "processes", "all runs", "ratio",
        "same plan",
    ]  # fmt: skip
    rows = []
    for case in cases:
        tf_runs, plain = got[(case.key, "tf")], got[(case.key, "")]
        a, b = (statistics.median(r["seconds"] for r in rs) for rs in (tf_runs, plain))
        steps = {r["step"] for r in tf_runs + plain}
        rows.append(
            [
                case.title, f"{a:.2f}", str(tf_runs[0]["workers"]),
                ", ".join(f"{r['seconds']:.2f}" for r in tf_runs), f"{b:.2f}",
                str(plain[0]["workers"]),
                ", ".join(f"{r['seconds']:.2f}" for r in plain), f"{a / b:.2f}",
                "yes" if len(steps) == 1 else "NO",
            ]
        )  # fmt: skip
    body = (
        "## Scale search: planning time after TensorFlow\n\n"
        f"Command: `{command_line()}` ({machine}).  Each plan in a fresh "
        "interpreter, `plan_transformer` with its defaults; *after "
        "TensorFlow*: the interpreter imported TensorFlow first (not timed), "
        "as a program that lowers its plan has, so the search runs in one "
        "process and OR-tools' import (after TensorFlow) is in the time; "
        "*without*: the setting of `bench/scale.py` (workers forked; OR-tools "
        "imported by the planner, in the time too).  The two settings in "
        "turn.\n\n" + markdown_table(headers, rows) + "\n"
    )
    print(body)
    if args.write:
        replace_section("scale-after-tf", body)


if __name__ == "__main__":
    main()

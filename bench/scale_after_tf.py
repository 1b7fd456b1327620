"""The scale search's planning time in a program that imported TensorFlow.

A program that lowers its plan has TensorFlow loaded when it plans.  The
search forks its workers, watched for a stall, wherever their CPU time can
be read (``layout_planner.scale_search.process_kind``): with
TensorFlow imported only (which runs no thread of its own, so a fork is safe
even unwatched, ``fork_is_safe``) and after TensorFlow has run an op (its
thread pools started).  With ``scale_workers.FORK_BESIDE_TENSORFLOW =
False`` (or after a stall) it starts a helper as a fresh interpreter there
instead and lays meshes out itself meanwhile.  OR-tools is imported after
TensorFlow (``RTLD_DEEPBIND``, docs/planner.md).  This plans each reference
model of ``bench/scale.py`` in a fresh interpreter that imported TensorFlow
and took 8 logical CPUs first (not timed): with ``plan_transformer``'s
defaults; after one TensorFlow op, with the defaults, with the helper, and
with ``workers=1`` (all in this process); and in one that did not import it
(the setting of ``bench/scale.py``).  ``--write`` puts the table in
docs/benchmarks.md, section ``scale-after-tf``.

    .venv/bin/python bench/scale_after_tf.py [--runs 3] [--only gpt3,...] [--write]
"""

from __future__ import annotations

import argparse
import json
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
from bench.scale import selected_or_error  # noqa: E402

_SETTINGS = {
    "tf": "TensorFlow imported",
    "ran": "TensorFlow ran an op",
    "ranhelper": "ran an op, no fork beside it",
    "ran1": "ran an op, workers=1",
    "": "without TensorFlow",
}

# Run in a fresh interpreter; argv: root, case key, setting (a key of
# _SETTINGS).
_CHILD = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, sys.argv[1])
setting = sys.argv[3]
if setting:
    import tensorflow  # what the program did before it planned
    import mtf_core
    mtf_core.logical_devices(8)  # its devices, taken first
    if setting.startswith("ran"):
        tensorflow.constant(1.0) + 1  # its runtime starts
from bench.scale import CASES
from layout_planner import scale_workers
from layout_planner.choices import plan_transformer
from layout_planner.scale_search import process_kind
from layout_planner.scale_workers import default_workers
if setting == "ranhelper":
    scale_workers.FORK_BESIDE_TENSORFLOW = False
case = next(c for c in CASES if c.key == sys.argv[2])
start = time.perf_counter()
workers = 1 if setting == "ran1" else None
plan = plan_transformer(case.config, case.devices, case.hardware,
                        encoder_decoder=case.encoder_decoder, workers=workers)
seconds = time.perf_counter() - start
workers = workers or default_workers()
how = {"one": "one process", "watched": f"{workers}, forked, watched",
       "forked": f"{workers}, forked",
       "fresh": f"{workers}, helper"}[process_kind(workers > 1)]
trials = [[str(t.choice), t.step_time_s, t.fits, t.note] for t in plan.trials]
print(json.dumps({"seconds": seconds, "how": how,
                  "plan": [str(plan.choice), plan.layout_rules, plan.step_time_s],
                  "trials": trials}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per model and setting")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if not 1 <= args.runs <= 20:
        ap.error(f"--runs {args.runs}: expected 1 to 20")
    cases = selected_or_error(ap, args.only)
    machine = machine_summary()
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    for run in range(args.runs):
        for case in cases:
            for setting in _SETTINGS:
                r = child_json(
                    _CHILD, [str(ROOT), case.key, setting], f"{case.key} {setting}"
                )
                got.setdefault((case.key, setting), []).append(r)
                print(
                    f"run {run + 1}/{args.runs} {case.key} {_SETTINGS[setting]}: "
                    f"{r['seconds']:.2f} s ({r['how']})",
                    flush=True,
                )
    # Each setting's processes, in its header where every run agrees.
    hows = {
        setting: {r["how"] for case in cases for r in got[(case.key, setting)]}
        for setting in _SETTINGS
    }
    headers = ["model"]
    for setting, name in _SETTINGS.items():
        (how,) = hows[setting] if len(hows[setting]) == 1 else ("",)
        headers.append(f"{name}{f' ({how})' if how else ''}: median s (all runs)")
    headers += ["watched / helper", "watched / one process", "same plan and trials"]
    rows = []
    for case in cases:
        row = [case.title]
        medians = {}
        for setting in _SETTINGS:
            rs = got[(case.key, setting)]
            medians[setting] = statistics.median(r["seconds"] for r in rs)
            runs = ", ".join(
                f"{r['seconds']:.2f}"
                + ("" if len(hows[setting]) == 1 else f" [{r['how']}]")
                for r in rs
            )
            row.append(f"{medians[setting]:.2f} ({runs})")
        answers = {
            json.dumps([r["plan"], r["trials"]])
            for setting in _SETTINGS
            for r in got[(case.key, setting)]
        }
        row += [
            f"{medians['ran'] / medians['ranhelper']:.2f}",
            f"{medians['ran'] / medians['ran1']:.2f}",
            "yes" if len(answers) == 1 else "NO",
        ]
        rows.append(row)
    body = (
        "## Scale search: planning time after TensorFlow\n\n"
        f"Command: `{command_line()}` ({machine}).  Each plan in a fresh "
        "interpreter; in the first four settings it imported TensorFlow "
        "first and took 8 logical CPUs (`mtf.logical_devices(8)`; not timed), "
        "as a program that lowers its plan has.  *TensorFlow imported*: "
        "`plan_transformer`'s defaults (TensorFlow runs no thread of its own "
        "yet); *TensorFlow ran an op* (`tf.constant(1.0) + 1`, its thread "
        "pools started): the defaults; both fork the workers, watched for a "
        "stall; *no fork beside it*: the "
        "same with `scale_workers.FORK_BESIDE_TENSORFLOW = False`, so a helper "
        "started as a fresh interpreter beside this process; *one process*: "
        "`workers=1`; *without*: an interpreter that did not import "
        "TensorFlow, the setting of `bench/scale.py`.  OR-tools' import is in "
        "every time.  The settings in turn.\n\n" + markdown_table(headers, rows) + "\n"
    )
    print(body)
    if args.write:
        replace_section("scale-after-tf", body)


if __name__ == "__main__":
    main()

"""The scale search's planning time against an earlier commit, alternating.

This host's speed drifts by a quarter within minutes, so a change to the
search is timed against the code before it in the same session: each
reference model (``bench/scale.py``'s cases) is planned by
``plan_transformer`` with its defaults, in a fresh interpreter each time
(OR-tools' import included, as a user's first plan pays it), by the base
commit's tree and by this one in turn.  Prints the medians, their ratio and
whether both trees gave the same plan (choice, layout, step to the last
bit, peak) and the same trials (every trial's choice, step, peak, fit and
layout; how many each tree ran); with ``--write`` puts them in
docs/benchmarks.md, section ``scale-ab``.

    .venv/bin/python bench/scale_ab.py --base REV [--runs 6]
        [--only gpt3,llama64,...] [--workers N] [--write]

``--workers 1`` plans in one process (its CPU seconds are then steadier
than the wall time of two), into section ``scale-ab-1``.

The base tree is a detached ``git worktree`` of ``REV`` in a temporary
directory, removed at the end; both trees run with this checkout's Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import (  # noqa: E402
    ROOT,
    base_commit,
    child_json,
    command_line,
    commit_tree,
    machine_summary,
    markdown_table,
    replace_section,
    short_commit,
)
from bench.scale import selected_or_error  # noqa: E402

# Run in a fresh interpreter with the tree's root first on sys.path.
_CHILD = """
import json, multiprocessing, resource, sys, time
sys.path.insert(0, sys.argv[1])
from bench.scale import CASES
from layout_planner.choices import plan_transformer
def cpu():
    return sum(
        r.ru_utime + r.ru_stime
        for r in map(resource.getrusage,
                     (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )
case = next(c for c in CASES if c.key == sys.argv[2])
start, cpu0 = time.perf_counter(), cpu()
workers = int(sys.argv[3]) if sys.argv[3] else None
plan = plan_transformer(case.config, case.devices, case.hardware,
                        encoder_decoder=case.encoder_decoder, workers=workers)
wall = time.perf_counter() - start
# The search's forked workers, stopped and not waited for since 995a441:
# reaped here, so that their CPU is counted.
for child in multiprocessing.active_children():
    child.join()
used = cpu() - cpu0
trials = [[str(t.choice), t.step_time_s, t.peak_memory_bytes, t.fits,
           t.layout_rules] for t in plan.trials]
print(json.dumps({"wall": wall, "cpu": used, "plan": [
    str(plan.choice), plan.layout_rules, plan.step_time_s,
    plan.peak_memory_bytes], "trials": trials}))
"""


#: One run: wall s, CPU s, digest of the plan, digest of its trials, trials.
_Run = tuple[float, float, str, str, int]


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:12]


def _plan(tree: str, key: str, workers: int | None) -> _Run:
    """(seconds, CPU seconds of the process and its workers, digests of
    the plan and of its trials, how many trials) of case ``key``."""
    got = child_json(_CHILD, [tree, key, str(workers or "")], f"{key} in {tree}", tree)
    trials = got["trials"]
    return got["wall"], got["cpu"], _digest(got["plan"]), _digest(trials), len(trials)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--base", required=True, type=base_commit, help="the commit to compare with"
    )
    ap.add_argument("--runs", type=int, default=6, help="runs per model and tree")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    ap.add_argument(
        "--workers", type=int, default=None, help="plan_transformer's workers"
    )
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: expected at least 1")
    if args.workers is not None and args.workers < 1:
        ap.error(f"--workers {args.workers}: expected at least 1")
    cases = selected_or_error(ap, args.only)
    base = args.base
    head = short_commit("HEAD")
    machine = machine_summary()  # the load as the runs start
    #: Each run, by (case, tree).
    runs: dict[tuple[str, str], list[_Run]] = {}
    with commit_tree(base) as tree:
        for run in range(args.runs):
            for case in cases:
                for who, root in (("base", tree), ("this", str(ROOT))):
                    got = _plan(root, case.key, args.workers)
                    runs.setdefault((case.key, who), []).append(got)
                    print(f"run {run + 1}/{args.runs} {case.key} {who}: "
                          f"{got[0]:.2f} s, CPU {got[1]:.2f} s",
                          flush=True)  # fmt: skip
    headers = [
        "model", f"this tree ({head}), median s", f"base ({base}), median s",
        "ratio", "this tree, all runs", "base, all runs",
        "CPU s, this tree / base (medians)", "same plan",
        "trials, this tree / base", "same trials",
    ]  # fmt: skip
    rows = []
    for case in cases:
        mine, theirs = runs[(case.key, "this")], runs[(case.key, "base")]
        walls = [[r[0] for r in rs] for rs in (mine, theirs)]
        m, b = (statistics.median(w) for w in walls)
        cm, cb = (statistics.median(r[1] for r in rs) for rs in (mine, theirs))
        same = ["yes" if len({r[k] for r in mine + theirs}) == 1 else "NO"
                for k in (2, 3)]  # fmt: skip
        # A tree's trials are the same in every run unless its search is not
        # deterministic (then "same trials" says NO).
        counts = " / ".join(
            "/".join(sorted({str(r[4]) for r in rs})) for rs in (mine, theirs)
        )
        rows.append(
            [
                case.title, f"{m:.2f}", f"{b:.2f}", f"{m / b:.2f}",
                *(", ".join(f"{t:.2f}" for t in w) for w in walls),
                f"{cm:.2f} / {cb:.2f}", same[0], counts, same[1],
            ]
        )  # fmt: skip
    procs = "" if args.workers is None else f", {args.workers} worker(s)"
    body = (
        f"## Scale search: planning time against an earlier commit{procs}\n\n"
        f"Command: `{command_line()}` ({machine}; each plan in a "
        "fresh interpreter, OR-tools' import included, the two trees in turn; "
        "CPU s: the interpreter's and its search workers', from `getrusage`)."
        "\n\n" + markdown_table(headers, rows) + "\n"
    )
    print(body)
    if args.write:
        key = "scale-ab" if args.workers is None else f"scale-ab-{args.workers}"
        replace_section(key, body)


if __name__ == "__main__":
    main()

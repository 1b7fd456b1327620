"""Planning one model after another in one long-lived process.

A service's solve worker plans every scale job in one process
(``api.scale_planning.plan_spec_locally``, one process per job's search), so
whatever a plan leaves behind stays for the next.  This plans the reference
models of ``bench/scale.py`` in rounds in one fresh interpreter per tree, as
the worker does (``workers=1``, the collector paused until the plan is
done, as the worker keeps it until its reply is sent), and reports each
round's planning time, the seconds a full collection after each plan took,
and after each round the process's resident memory and how many
``mtf.Graph`` objects are still alive.  With ``--base REV`` the same runs on that commit's tree first.

    .venv/bin/python bench/repeat_planning.py [--rounds 3] [--base REV]
        [--only gpt3,t5,...] [--write]

``--write`` puts the table in docs/benchmarks.md, section ``repeat-planning``.
"""

from __future__ import annotations

import argparse
import os
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
import gc, json, os, sys, time
sys.path.insert(0, sys.argv[1])
import layout_planner.ortools_import  # as a worker, OR-tools imported first
import layout_planner.cpsat
from bench.scale import CASES
from layout_planner.choices import plan_transformer
from mtf_core.graph import Graph
keys, rounds = sys.argv[2].split(","), int(sys.argv[3])
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
out = []
for _ in range(rounds):
    seconds = collecting = 0.0
    for case in [c for c in CASES if c.key in keys]:
        # As the worker answers: the collector paused until the reply is
        # sent, then what the plan left is collected.
        gc.disable()
        start = time.perf_counter()
        plan = plan_transformer(case.config, case.devices, case.hardware,
                                encoder_decoder=case.encoder_decoder, workers=1)
        seconds += time.perf_counter() - start
        del plan
        gc.enable()
        start = time.perf_counter()
        gc.collect()
        collecting += time.perf_counter() - start
    graphs = sum(isinstance(o, Graph) for o in gc.get_objects())
    out.append({"seconds": seconds, "collecting": collecting,
                "resident": resident(), "graphs": graphs})
print(json.dumps(out))
"""


def _rounds(tree: str, keys: list[str], rounds: int) -> list[dict[str, float]]:
    got = child_json(
        _CHILD, [tree, ",".join(keys), str(rounds)], f"rounds in {tree}", tree
    )
    assert isinstance(got, list)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every model")
    ap.add_argument(
        "--base", type=base_commit, default=None, help="a commit to compare"
    )
    ap.add_argument("--only", default="", help="comma-separated case keys")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if not 1 <= args.rounds <= 20:
        ap.error(f"--rounds {args.rounds}: expected 1 to 20")
    cases = selected_or_error(ap, args.only)
    keys = [c.key for c in cases]
    machine = machine_summary()
    trees: list[tuple[str, list[dict[str, float]]]] = []
    if args.base is not None:
        with commit_tree(args.base) as tree:
            print(f"base ({args.base}) ...", flush=True)
            trees.append((f"base ({args.base})", _rounds(tree, keys, args.rounds)))
    print("this tree ...", flush=True)
    trees.append(
        (f"this tree ({short_commit('HEAD')})", _rounds(str(ROOT), keys, args.rounds))
    )
    headers = [
        "tree", "round", "planning s (all models)",
        "collecting each plan's garbage, s (all models)", "resident MiB after",
        "graphs alive after",
    ]  # fmt: skip
    rows = [
        [
            name,
            str(i + 1),
            f"{r['seconds']:.2f}",
            f"{r['collecting']:.2f}",
            f"{r['resident'] / 2**20:.0f}",
            str(r["graphs"]),
        ]  # fmt: skip
        for name, got in trees
        for i, r in enumerate(got)
    ]
    names = ", ".join(c.title for c in cases)
    body = (
        "## Planning one model after another in one process\n\n"
        f"Command: `{command_line()}` ({machine}).  Each round plans {names} "
        "with `workers=1` and the collector paused, as a service's solve "
        "worker plans until its reply is sent, in one fresh interpreter per "
        "tree; after each plan, a full collection (timed: the worker does it "
        "while it waits for its next job); after each round, the process's "
        "resident memory and the `mtf.Graph` objects still alive.\n\n"
        + markdown_table(headers, rows)
        + "\n"
    )
    print(body)
    if args.write:
        replace_section("repeat-planning", body)


if __name__ == "__main__":
    main()

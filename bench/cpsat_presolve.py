"""CP-SAT with and without its presolve, on the scale search's own programs.

Plans each reference model of ``bench/scale.py`` in one process, keeps a
copy of every model CP-SAT is given (free layouts, tie-breaks, joint
recomputation programs), then solves each copy again with presolve on and
off, one after the other in the same run, with the planner's other
settings (``layout_planner.cpsat.TUNING``, one worker, seed 0).  Prints, per
model, the programs' count, the seconds each way and whether every optimum
is the same (and how many programs presolve calls infeasible that are
solved without it); ``--write`` puts the table in docs/benchmarks.md, section
``cpsat-presolve``.

    .venv/bin/python bench/cpsat_presolve.py [--write] [--only gpt3,t5,...]
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ortools.sat.python import cp_model  # noqa: E402

from bench.common import machine_summary, markdown_table, replace_section  # noqa: E402
from bench.cpsat_programs import alternated, captured, same_answer, solved  # noqa: E402
from bench.scale import selected  # noqa: E402
from layout_planner.choices import plan_transformer  # noqa: E402


def _captured(case) -> list[cp_model.CpModel]:
    """Every model the search of ``case`` gives CP-SAT, as given (hints
    included)."""
    with captured() as models:
        plan_transformer(
            case.config,
            case.devices,
            case.hardware,
            encoder_decoder=case.encoder_decoder,
            workers=1,
        )
    return [model for model, _ in models]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    args = ap.parse_args()
    rows = []
    for case in selected(args.only):
        print(f"{case.title}: planning to capture its programs", flush=True)
        models = _captured(case)
        on = off = 0.0
        same = wrong = 0
        for i, model in enumerate(models):
            a, b = alternated(
                i, partial(solved, model, True), partial(solved, model, False)
            )
            on += a.seconds
            off += b.seconds
            same += same_answer(a, b)
            # A program presolve calls infeasible that is solved without it:
            # with the planner's settings (probing off), presolve is wrong
            # about some tie-break programs, whose last answer is feasible
            # by construction.
            wrong += a.status == "INFEASIBLE" and b.status == "OPTIMAL"
        print(
            f"  {len(models)} programs: presolve {on:.2f} s, none {off:.2f} s, "
            f"same answer {same} of {len(models)}, {wrong} wrongly infeasible",
            flush=True,
        )
        rows.append(
            [case.title, len(models), f"{on:.2f}", f"{off:.2f}", f"{off / on:.2f}",
             f"{same} of {len(models)}", wrong]
        )  # fmt: skip
    table = markdown_table(
        [
            "model",
            "programs",
            "presolve s",
            "no presolve s",
            "ratio",
            "same answer",
            "infeasible only with presolve",
        ],  # fmt: skip
        rows,
    )
    print(table)
    if args.write:
        replace_section(
            "cpsat-presolve",
            "Command: `.venv/bin/python bench/cpsat_presolve.py --write` "
            f"({machine_summary()}).  Every CP-SAT program the scale search "
            "of each reference model solves, solved again with CP-SAT's "
            "presolve and without it (one worker, the planner's other "
            "settings); the scale search runs without it "
            '(`SolveParams.presolve`).  "Infeasible only with presolve": '
            "programs that presolve, with the planner's settings (probing "
            "off), calls infeasible and that are solved to optimality "
            "without it (tie-break programs, which the previous answer "
            "satisfies by construction).\n\n" + table,
            title="CP-SAT presolve on the scale search's programs",
        )


if __name__ == "__main__":
    main()

"""CP-SAT's inprocessing and clique merging, on the planner's own programs.

The planner turns off two CP-SAT settings (``layout_planner.cpsat.TUNING``):
the SAT solver's inprocessing (``use_sat_inprocessing``: probing and
transitive reduction between restarts) and the merging of at-most-one
constraints into maximal cliques when a model loads
(``merge_at_most_one_work_limit``).  This keeps a copy of every model CP-SAT
is given while planning (each reference model of ``bench/scale.py``, in one
process, and the Transformer LM of ``bench/planner.py`` at 1, 8 and 64
layers on its four meshes), then solves each copy again with the planner's
settings and with CP-SAT's defaults for those two, one after the other in
the same run (which goes first alternates; one worker, seed 0, the hint as
given, presolve as planning had it: off in the scale search).  Prints per
source the programs, the seconds each way and whether every answer is the
same (status and objective); ``--write`` puts the table in
docs/benchmarks.md, section ``cpsat-settings``.

    .venv/bin/python bench/cpsat_settings.py [--write] [--only gpt3,planner,...]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ortools.sat import sat_parameters_pb2  # noqa: E402

from bench.common import machine_summary, markdown_table, replace_section  # noqa: E402
from bench.cpsat_programs import alternated, captured, same_answer, solved  # noqa: E402
from bench.planner import SIZES  # noqa: E402
from bench.scale import CASES  # noqa: E402
from layout_planner.choices import plan_transformer  # noqa: E402
from layout_planner.planner import auto_layout  # noqa: E402
from mtf_core.models import TransformerConfig, build_lm  # noqa: E402

#: The settings compared, and CP-SAT's own defaults for them.
SETTINGS = ("use_sat_inprocessing", "merge_at_most_one_work_limit")
_DEFAULTS = {
    name: getattr(sat_parameters_pb2.SatParameters(), name) for name in SETTINGS
}


def _planner() -> None:
    for layers in (1, 8, 64):
        model = build_lm(
            TransformerConfig(num_layers=layers, **SIZES), optimizer="adam"
        )
        for mesh in ("x:8", "x:2;y:4", "x:2;y:2;z:2", "x:4;y:4;z:4"):
            auto_layout(
                model.graph, mesh, [model.loss], "h100-nvlink-ib", num_workers=1,
                verify=False,
            )  # fmt: skip


def _sources() -> dict[str, tuple[str, Callable[[], object]]]:
    out: dict[str, tuple[str, Callable[[], object]]] = {}
    for case in CASES:
        out[case.key] = (
            case.title,
            lambda case=case: plan_transformer(
                case.config,
                case.devices,
                case.hardware,
                encoder_decoder=case.encoder_decoder,
                workers=1,
            ),
        )
    out["planner"] = ("Transformer LM, 1/8/64 layers, 4 meshes (auto_layout)", _planner)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--only", default="", help="comma-separated keys (cases, planner)")
    args = ap.parse_args()
    sources = _sources()
    keys = [k for k in args.only.split(",") if k] or list(sources)
    unknown = [k for k in keys if k not in sources]
    if unknown:
        ap.error(f"--only {','.join(unknown)}: expected some of {','.join(sources)}")
    rows = []
    for key in keys:
        title, run = sources[key]
        print(f"{title}: planning to capture its programs", flush=True)
        with captured() as models:
            run()
        tuned = plain = 0.0
        same = 0
        for i, (model, presolve) in enumerate(models):
            t, p = alternated(
                i,
                partial(solved, model, presolve),
                partial(solved, model, presolve, _DEFAULTS),
            )
            tuned += t.seconds
            plain += p.seconds
            same += same_answer(t, p)
        print(
            f"  {len(models)} programs: planner's settings {tuned:.2f} s, "
            f"CP-SAT's defaults {plain:.2f} s, same answer {same} of {len(models)}",
            flush=True,
        )
        rows.append(
            [title, len(models), f"{tuned:.2f}", f"{plain:.2f}",
             f"{tuned / plain:.2f}", f"{same} of {len(models)}"]
        )  # fmt: skip
    table = markdown_table(
        ["source", "programs", "planner's settings s", "CP-SAT's defaults s",
         "ratio", "same answer"],
        rows,
    )  # fmt: skip
    print(table)
    if args.write:
        replace_section(
            "cpsat-settings",
            "Command: `.venv/bin/python bench/cpsat_settings.py --write` "
            f"({machine_summary()}).  Every CP-SAT program that planning "
            "each source solves, solved again with the planner's settings "
            "(`layout_planner.cpsat.TUNING`: no inprocessing, no clique "
            "merging) and with CP-SAT's defaults for those two (inprocessing "
            "on, a merging work limit of 1e8), one after the other, one "
            "worker, presolve as planning had it (off in the scale "
            "search).\n\n" + table,
            title="CP-SAT inprocessing and clique merging on the planner's programs",
        )


if __name__ == "__main__":
    main()

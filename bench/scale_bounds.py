"""How much of the scale search's work its bounds could have skipped.

Plans each reference model of ``bench/scale.py`` in one process
(``workers=1``) and records, for every mesh of the first pass, the bound it
was ordered by (the flops bound, :mod:`layout_planner.scale_bounds`), what
its free layout's program proved (CP-SAT's bound on every layout of the
mesh) and whether that layout fitted; and every joint recomputation program
the second pass ran.  Then, against the plan's step: the free layouts that
could not have won (their proven bound is no better than the plan's step:
a bound as tight, known before laying the mesh out, would have skipped it)
and the joint programs that did not find the plan.  Prints (and with
``--write`` puts in docs/benchmarks.md, section ``scale-bounds``) one row
per model.

    .venv/bin/python bench/scale_bounds.py [--write] [--only gpt3,llama64,...]
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import Patching  # noqa: E402
from bench.scale_phases import bench_main  # noqa: E402
from layout_planner import scale_search  # noqa: E402


class _Record(Patching):
    """Wraps the search to note its first-pass meshes, each free layout
    (mesh sizes, proven bound, fits) and each joint program's trial."""

    def __init__(self) -> None:
        super().__init__()
        self.meshes: list[Any] = []
        self.free: list[tuple[tuple[int, ...], float, bool]] = []
        #: Each joint program's trial (None: it raised, nothing fitted).
        self.joint: list[Any] = []
        self._in_free = 0  # inside a free layout's _free_trial

    def __enter__(self) -> _Record:
        search, free_trial, trial = (
            scale_search.search,
            scale_search._free_trial,
            scale_search._trial,
        )

        def recorded_search(cfg: Any, meshes: Any, *args: Any, **kw: Any) -> Any:
            self.meshes = list(meshes)
            return search(cfg, meshes, *args, **kw)

        def recorded_free(stages: Any, options: Any, *args: Any) -> Any:
            self._in_free += 1
            try:
                outcome, bound = free_trial(stages, options, *args)
            finally:
                self._in_free -= 1
            c = options[0]
            fits = outcome is not None and outcome.trial.fits
            self.free.append(((*c.mesh_sizes, c.micro_batches), bound, fits))
            return outcome, bound

        def recorded_trial(*args: Any, **kw: Any) -> Any:
            # Every trial the search runs outside a free layout is a joint
            # program (the fewer-micro-batch rounds lay meshes out free).
            joint = not self._in_free
            try:
                outcome = trial(*args, **kw)
            except Exception:
                if joint:  # nothing fitted (the search notes why)
                    self.joint.append(None)
                raise
            if joint:
                self.joint.append(outcome.trial)
            return outcome

        for name, f in (
            ("search", recorded_search),
            ("_free_trial", recorded_free),
            ("_trial", recorded_trial),
        ):
            self.replace(scale_search, name, f)
        return self


def _span(values: list[float]) -> str:
    return f"{min(values):.3g}-{max(values):.3g}" if values else "-"


def run(cases: list[Any]) -> str:
    rows = [
        "| model | plan's step s | first-pass meshes | their flops bounds s | "
        "free layouts (fit) | their proven bounds s | free layouts that could "
        "not win | joint programs | joint programs that found no faster step |"
        "\n|---|---:|---:|---|---|---|---:|---:|---:|"
    ]
    for case in cases:
        with _Record() as rec:
            plan = case.plan(1)
        step = min(
            t.step_time_s
            for t in plan.trials
            if t.fits and t.step_time_s is not None and t.choice == plan.choice
        )
        first = {(*m.sizes[:4], m.micro_batches) for m in rec.meshes}
        pass1 = [f for f in rec.free if f[0] in first]
        fits = sum(f[2] for f in pass1)
        hopeless = sum(bound >= step for _, bound, _ in pass1)
        losing = sum(
            t is None
            or not (t.fits and t.step_time_s is not None and t.step_time_s <= step)
            for t in rec.joint
        )
        rows.append(
            f"| {case.title} | {step:.4g} | {len(rec.meshes)} | "
            f"{_span([m.bound_s for m in rec.meshes])} | {len(pass1)} ({fits}) | "
            f"{_span([b for _, b, _ in pass1])} | {hopeless} | {len(rec.joint)} | "
            f"{losing} |"
        )
        print(rows[-1], flush=True)
    return "\n".join(rows)


def main() -> None:
    bench_main(
        __doc__,
        run,
        "scale-bounds",
        "Scale search: what its bounds could skip",
        "Per model, planned in one process: the first pass lays out every "
        "mesh whose flops bound beats the best step found; a free layout "
        "*could not win* where its program's proven bound is no better than "
        "the plan's step (a valid bound that tight, known beforehand, would "
        "have skipped it); a joint program *found no faster step* where its "
        "trial did not fit or was slower than the plan.",
    )


if __name__ == "__main__":
    main()

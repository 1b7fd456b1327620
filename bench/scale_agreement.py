"""The scale search gives one answer however it runs, on random models.

For each seed, a random small Transformer (dense, a mixture of experts or an
encoder-decoder; 2-12 layers), device count (4, 8 or 16) and hardware preset
is planned by ``plan_transformer`` without a memory limit; for most seeds a
limit somewhere between a third of that plan's peak and just under it is
then set, which makes layouts not fit and sends the search through its joint
recomputation programs.  Under that limit the model is planned three ways:

* in one process (``workers=1``), the reference;
* on two forked processes (``workers=2``): the trials are computed ahead and
  out of order, and must come back the same to the last bit;
* exhaustively (``exhaustive=True``): every trial on its full stage graph
  instead of the 2-4 layer representatives, the same plan and trials (the
  steps within 1e-9 relative; the bytes exactly).

Prints one line per seed and a summary; with ``--write`` puts the summary in
docs/benchmarks.md, section ``scale-agreement``.  It forks, so it runs in a
process without TensorFlow.

    .venv/bin/python bench/scale_agreement.py [--seeds 100] [--start 0] [--write]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import markdown_table, replace_section  # noqa: E402
from layout_planner.choices import ScaleError, plan_transformer  # noqa: E402
from layout_planner.ortools_import import load_cp_sat  # noqa: E402
from mtf_core.models import TransformerConfig  # noqa: E402

PRESETS = ["h100-nvlink-ib", "a100-nvlink-ib", "tpu-v4"]


def case(seed: int) -> tuple[TransformerConfig, int, str, bool, random.Random]:
    """Seed ``seed``'s model, devices, preset and encoder-decoder flag, and
    its generator (which then draws the memory limit)."""
    r = random.Random(seed)
    heads = r.choice([2, 4, 8])
    experts = r.choice([0, 0, 0, 4])
    cfg = TransformerConfig(
        num_layers=r.choice([2, 3, 4, 6, 8, 12]),
        d_model=r.choice([64, 128, 256]),
        heads=heads,
        d_kv=r.choice([16, 32]),
        d_ff=r.choice([128, 256, 1024]),
        vocab=r.choice([256, 512, 1000]),
        length=r.choice([16, 64, 128]),
        batch=r.choice([8, 16, 24, 32, 64]),
        activation_dtype=r.choice(["float32", "bfloat16"]),
        activation=r.choice(["relu", "gelu"]),
        experts=experts,
    )
    devices = r.choice([4, 8, 16])
    hardware = r.choice(PRESETS)
    encoder_decoder = experts == 0 and r.random() < 0.2
    return cfg, devices, hardware, encoder_decoder, r


def _plan(cfg: TransformerConfig, devices: int, hw: str, ed: bool, limit: int | None,
          **kw: Any) -> Any:  # fmt: skip
    """The plan, or the error's text where no plan fits."""
    try:
        return plan_transformer(
            cfg, devices, hw, encoder_decoder=ed, memory_limit=limit,
            time_limit_s=30.0, **kw,
        )  # fmt: skip
    except ScaleError as e:
        return f"ScaleError: {e}"


def difference(name: str, got: Any, ref: Any, exact: bool) -> str | None:
    """How ``got`` differs from ``ref`` (plans or error texts), or None."""
    if isinstance(got, str) or isinstance(ref, str):
        return (
            None if got == ref else f"{name}: {str(got)[:80]} against {str(ref)[:80]}"
        )

    def close(a: float | None, b: float | None) -> bool:
        if a is None or b is None or exact:
            return a == b
        return math.isclose(a, b, rel_tol=1e-9)

    if str(got.choice) != str(ref.choice):
        return f"{name}: chose {got.choice}, against {ref.choice}"
    if not close(got.step_time_s, ref.step_time_s):
        return f"{name}: step {got.step_time_s!r} s against {ref.step_time_s!r} s"
    if got.peak_memory_bytes != ref.peak_memory_bytes:
        return (
            f"{name}: peak {got.peak_memory_bytes} B against {ref.peak_memory_bytes} B"
        )
    a, b = got.trials, ref.trials
    if [(str(t.choice), t.fits) for t in a] != [(str(t.choice), t.fits) for t in b]:
        return f"{name}: trials {[str(t.choice) for t in a]} against {[str(t.choice) for t in b]}"
    for x, y in zip(a, b):
        if (
            not close(x.step_time_s, y.step_time_s)
            or x.peak_memory_bytes != y.peak_memory_bytes
        ):
            return f"{name}: trial {x.choice}: {x.step_time_s!r} s, {x.peak_memory_bytes} B against {y.step_time_s!r} s, {y.peak_memory_bytes} B"  # fmt: skip
        if exact and x.layout_rules != y.layout_rules:
            return f"{name}: trial {x.choice}: rules {x.layout_rules} against {y.layout_rules}"
    return None


def run(seeds: range) -> tuple[list[list[Any]], list[str]]:
    """The summary rows (per model kind) and every difference found."""
    kinds: Counter[tuple[str, str]] = Counter()
    found: list[str] = []
    differing: Counter[str] = Counter()  # seeds with a difference, per kind
    for seed in seeds:
        cfg, devices, hw, ed, r = case(seed)
        kind = "encoder-decoder" if ed else "MoE" if cfg.experts else "dense"
        t0 = time.perf_counter()
        free = _plan(cfg, devices, hw, ed, None, workers=1)
        limit = None
        if not isinstance(free, str) and r.random() < 0.6:
            limit = int(free.peak_memory_bytes * r.uniform(0.3, 0.95))
        one = _plan(cfg, devices, hw, ed, limit, workers=1) if limit else free
        two = _plan(cfg, devices, hw, ed, limit, workers=2)
        full = _plan(cfg, devices, hw, ed, limit, workers=1, exhaustive=True)
        diffs = [
            d
            for d in (
                difference("two processes", two, one, exact=True),
                difference("exhaustive", full, one, exact=False),
            )
            if d
        ]
        found += [f"seed {seed} ({kind}): {d}" for d in diffs]
        differing[kind] += bool(diffs)
        outcome = "no plan fits" if isinstance(one, str) else "plan"
        if not isinstance(one, str) and any(not t.fits for t in one.trials):
            outcome = "plan; some trials do not fit"
        kinds[(kind, outcome)] += 1
        kinds[(kind, "limit" if limit else "no limit")] += 1
        print(
            f"seed {seed}: {kind}, {devices} x {hw}, "
            f"{'limit ' + format(limit, ',') + ' B' if limit else 'no limit'}: "
            f"{outcome}, {'; '.join(diffs) or 'the same'} "
            f"({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    rows = []
    for kind in ("dense", "MoE", "encoder-decoder"):
        models = kinds[(kind, "limit")] + kinds[(kind, "no limit")]
        rows.append([
            kind, models, kinds[(kind, "limit")],
            kinds[(kind, "plan; some trials do not fit")], kinds[(kind, "no plan fits")],
            differing[kind],
        ])  # fmt: skip
    return rows, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds")
    ap.add_argument("--start", type=int, default=0, help="the first seed")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.seeds < 1 or args.start < 0:
        ap.error(f"--seeds {args.seeds} --start {args.start}: expected >= 1 and >= 0")
    load_cp_sat()
    t0 = time.perf_counter()
    rows, found = run(range(args.start, args.start + args.seeds))
    headers = [
        "models", "seeds", "with a memory limit", "plans with trials that do not fit",
        "no plan fits", "seeds with a difference",
    ]  # fmt: skip
    table = markdown_table(headers, rows)
    print(table)
    for f in found:
        print(f)
    if args.write:
        replace_section(
            "scale-agreement",
            f"Command: `.venv/bin/python bench/scale_agreement.py --seeds {args.seeds} "
            f"--start {args.start} --write` ({time.perf_counter() - t0:.0f} s, 2 cores).  "
            "Random small models, 60% of them under a memory limit drawn below "
            "their unlimited plan's peak, planned in one process, on two forked "
            "processes and exhaustively (every trial on its full stage graph); a "
            "difference is any other plan or trial: its choice, fit, peak and step "
            "(to the last bit, and the same layout, on two processes; within 1e-9 "
            "relative exhaustively).\n\n"
            + table
            + ("\n\n" + "\n".join(f"* {f}" for f in found) if found else ""),
            title="Scale search: one answer however it runs",
        )


if __name__ == "__main__":
    main()

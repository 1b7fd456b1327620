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
  steps within 1e-9 relative; the bytes exactly);
* in one process without the bound that leaves recomputation options out
  of the joint programs (``scale_bounds.copy_rates`` all 0): every option
  in every program, the same plan and trials to the last bit.

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
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import markdown_table, replace_section  # noqa: E402
from layout_planner import scale_search  # noqa: E402
from layout_planner.choices import (  # noqa: E402
    RECOMPUTE_TRIALS,
    ScaleError,
    plan_transformer,
)
from layout_planner.ortools_import import load_cp_sat  # noqa: E402
from layout_planner.recompute_program import solve_with_recomputation  # noqa: E402
from mtf_core.models import TransformerConfig  # noqa: E402

PRESETS = ["h100-nvlink-ib", "a100-nvlink-ib", "tpu-v4"]


def case(
    seed: int, wide: bool = False
) -> tuple[TransformerConfig, int, str, bool, random.Random]:
    """Seed ``seed``'s model, devices, preset and encoder-decoder flag, and
    its generator (which then draws the memory limit).  ``wide``: the same
    draws with the widths and lengths of large models (d_model 1,024-4,096,
    sequences of 512-2,048), where recomputing costs enough for the bound
    on it to leave options out of joint programs; a graph costs the same to
    build and price at any size."""
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
    if wide:
        cfg = cfg.replace(
            d_model=cfg.d_model * 16, d_kv=cfg.d_kv * 4, d_ff=cfg.d_ff * 16,
            length=cfg.length * 16, vocab=cfg.vocab * 32,
        )  # fmt: skip
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


def _counted(cfg: TransformerConfig, devices: int, hw: str, ed: bool,
             limit: int) -> tuple[Any, int]:  # fmt: skip
    """The plan in one process, and how many recomputation options the
    bound left out of its joint programs."""
    left_out = 0

    def counted(problems: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal left_out
        left_out += len(RECOMPUTE_TRIALS) - len(problems)
        return solve_with_recomputation(problems, *args, **kwargs)

    with mock.patch.object(scale_search, "solve_with_recomputation", counted):
        return _plan(cfg, devices, hw, ed, limit, workers=1), left_out


def _no_copy_rates(cfg: Any, builder: Any, optimizer: Any, least: Any, options: Any,
                   *args: Any, **kwargs: Any) -> dict[Any, float]:  # fmt: skip
    return dict.fromkeys(options, 0.0)


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


def run(seeds: range, wide: bool = False) -> tuple[list[list[Any]], list[str]]:
    """The summary rows (per model kind) and every difference found."""
    kinds: Counter[tuple[str, str]] = Counter()
    found: list[str] = []
    differing: Counter[str] = Counter()  # seeds with a difference, per kind
    bounded: Counter[str] = Counter()  # seeds with an option bounded out
    for seed in seeds:
        cfg, devices, hw, ed, r = case(seed, wide)
        kind = "encoder-decoder" if ed else "MoE" if cfg.experts else "dense"
        t0 = time.perf_counter()
        free = _plan(cfg, devices, hw, ed, None, workers=1)
        limit = None
        if not isinstance(free, str) and r.random() < 0.6:
            limit = int(free.peak_memory_bytes * r.uniform(0.3, 0.95))
        one, left_out = _counted(cfg, devices, hw, ed, limit) if limit else (free, 0)
        two = _plan(cfg, devices, hw, ed, limit, workers=2)
        full = _plan(cfg, devices, hw, ed, limit, workers=1, exhaustive=True)
        with mock.patch.object(scale_search, "copy_rates", _no_copy_rates):
            every = _plan(cfg, devices, hw, ed, limit, workers=1)
        diffs = [
            d
            for d in (
                difference("two processes", two, one, exact=True),
                difference("exhaustive", full, one, exact=False),
                difference("every option", every, one, exact=True),
            )
            if d
        ]
        found += [f"seed {seed} ({kind}): {d}" for d in diffs]
        differing[kind] += bool(diffs)
        bounded[kind] += left_out > 0
        outcome = "no plan fits" if isinstance(one, str) else "plan"
        if not isinstance(one, str) and any(not t.fits for t in one.trials):
            outcome = "plan; some trials do not fit"
        kinds[(kind, outcome)] += 1
        kinds[(kind, "limit" if limit else "no limit")] += 1
        print(
            f"seed {seed}: {kind}, {devices} x {hw}, "
            f"{'limit ' + format(limit, ',') + ' B' if limit else 'no limit'}: "
            f"{outcome}, {left_out} options bounded out, "
            f"{'; '.join(diffs) or 'the same'} "
            f"({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    rows = []
    for kind in ("dense", "MoE", "encoder-decoder"):
        models = kinds[(kind, "limit")] + kinds[(kind, "no limit")]
        rows.append([
            kind, models, kinds[(kind, "limit")],
            kinds[(kind, "plan; some trials do not fit")], kinds[(kind, "no plan fits")],
            bounded[kind], differing[kind],
        ])  # fmt: skip
    return rows, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100, help="how many seeds")
    ap.add_argument("--start", type=int, default=0, help="the first seed")
    ap.add_argument(
        "--wide", action="store_true", help="large models' widths and lengths"
    )
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.seeds < 1 or args.start < 0:
        ap.error(f"--seeds {args.seeds} --start {args.start}: expected >= 1 and >= 0")
    load_cp_sat()
    t0 = time.perf_counter()
    rows, found = run(range(args.start, args.start + args.seeds), args.wide)
    headers = [
        "models", "seeds", "with a memory limit", "plans with trials that do not fit",
        "no plan fits", "an option bounded out of a joint program",
        "seeds with a difference",
    ]  # fmt: skip
    table = markdown_table(headers, rows)
    print(table)
    for f in found:
        print(f)
    if args.write:
        wide = " --wide" if args.wide else ""
        kind = (
            "Random models of large models' widths and lengths"
            if args.wide
            else "Random small models"
        )
        replace_section(
            "scale-agreement" + ("-wide" if args.wide else ""),
            f"Command: `.venv/bin/python bench/scale_agreement.py --seeds {args.seeds} "
            f"--start {args.start}{wide} --write` ({time.perf_counter() - t0:.0f} s, "
            f"2 cores).  {kind}, 60% of them under a memory limit drawn below "
            "their unlimited plan's peak, planned in one process, on two forked "
            "processes, exhaustively (every trial on its full stage graph) and "
            "in one process with every recomputation option in every joint "
            "program (no bound leaving one out); a "
            "difference is any other plan or trial: its choice, fit, peak and step "
            "(to the last bit, and the same layout, on two processes and with every "
            "option; within 1e-9 relative exhaustively).\n\n"
            + table
            + ("\n\n" + "\n".join(f"* {f}" for f in found) if found else ""),
            title="Scale search: one answer however it runs"
            + (", at large models' widths" if args.wide else ""),
        )


if __name__ == "__main__":
    main()

"""Recomputation chosen in one CP-SAT model vs one solve per option.

A stage of GPT-3's shape (d_model 12288, 96 heads of 128, d_ff 49152, vocab
51200, length 2048, bfloat16 activations, Adam, shardable weights and
slots; ``--layers`` layers, a micro-batch of ``--batch`` sequences) on one
mesh, for each recomputation option of the scale planner (keep everything,
recompute the attention scores, recompute both blocks): one
``LayoutProblem`` per option, built once, then at several capacities per
device:

* joint: ``recompute_program.solve_with_recomputation`` (one model);
* each alone: the same call with ``jointly=False`` (one solve per option,
  the fastest kept: the same answer);
* first fit: today's scale search, ``plan_problem`` per option from least
  recomputation to most, keeping the first that fits (an option that does
  not fit costs its solve and the smallest-peak solve that says by how much).

Capacities: the device's, each option's smallest peak (the option fits, in
its smallest-peak layout only), and one byte below it (the option cannot
fit; below the last, nothing fits).  Seconds are the median
of ``--repeats`` calls (wall clock, one CP-SAT worker, tables already built).

    .venv/bin/python bench/recompute_program.py [--mesh "dp:16;tp:4"]
        [--hardware a100-nvlink-ib] [--layers 3] [--batch 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import machine_summary, markdown_table  # noqa: E402
from cost_models.profiles import get_hardware  # noqa: E402
from layout_planner import solver_process  # noqa: E402
from layout_planner.plan_mesh import plan_problem  # noqa: E402
from layout_planner.problem import LayoutProblem  # noqa: E402
from layout_planner.program import Objective, SolveParams  # noqa: E402
from layout_planner.recompute_program import solve_with_recomputation  # noqa: E402
from mtf_core.models import TransformerConfig, build_lm  # noqa: E402
from mtf_core.shapes import convert_to_shape  # noqa: E402

GPT3 = TransformerConfig(
    num_layers=96, d_model=12288, heads=96, d_kv=128, d_ff=49152, vocab=51200,
    length=2048, batch=1536, activation="gelu", activation_dtype="bfloat16",
    shardable_weights=True, shardable_slots=True,
)  # fmt: skip
OPTIONS = (("none", "none"), ("scores", "none"), ("block", "block"))


def median(
    fn: Callable[..., Any], repeats: int, *args: Any, **kwargs: Any
) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and its median wall time over ``repeats`` calls."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def first_fit(
    problems: dict[tuple[str, str], LayoutProblem], capacity: int, params: SolveParams
) -> tuple[tuple[str, str], float, bool]:
    """Today's search on one mesh: the first option that fits."""
    for key, problem in problems.items():
        limited = copy.copy(problem)
        limited.hw = problem.hw.with_memory(capacity)
        plan = plan_problem(limited, Objective.TIME, params, verify=False, extras=False)
        if plan.cost.fits:
            return key, plan.cost.time_s, True
    return key, plan.cost.time_s, False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mesh", default="dp:16;tp:4")
    ap.add_argument("--hardware", default="a100-nvlink-ib")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    hw = get_hardware(args.hardware)
    mesh = convert_to_shape(args.mesh)
    params = SolveParams(time_limit_s=60, num_workers=1, seed=0)
    t0 = time.perf_counter()
    problems = {}
    for attn, ffn in OPTIONS:
        cfg = GPT3.replace(
            num_layers=args.layers,
            batch=args.batch,
            recompute_attention=attn,
            recompute_ffn=ffn,
        )
        model = build_lm(cfg, optimizer="adam")
        problems[(attn, ffn)] = LayoutProblem(model.graph, mesh, hw, [model.loss])
    print(f"problems built in {time.perf_counter() - t0:.2f} s", flush=True)
    # Each option's smallest peak (the memory objective; its layout priced
    # from the tables, since a solve the time limit cut short states a loose
    # peak).
    smallest = {}
    for key, problem in problems.items():
        least = problem.program(Objective.MEMORY, hw.memory_bytes)
        got, _ = solver_process.solve(least, SolveParams(20, 1, 0))
        asg = problem.assignment_from_x(got.solutions[0].x)
        smallest[key] = problem.table_cost(asg).peak_bytes
        print(
            f"{key}: smallest peak {smallest[key]:,} B ({got.status.value})",
            flush=True,
        )
    capacities = [("device", hw.memory_bytes)]
    for attn, ffn in OPTIONS:
        peak = smallest[(attn, ffn)]
        capacities.append((f"{attn}/{ffn}'s smallest peak", peak))
        capacities.append((f"below {attn}/{ffn}'s smallest peak", peak - 1))
    rows = []
    for label, cap in capacities:
        n = args.repeats
        solve = solve_with_recomputation
        joint, t_joint = median(solve, n, problems, params, cap)
        alone, t_alone = median(solve, n, problems, params, cap, jointly=False)
        (fit_key, fit_time, fits), t_first = median(first_fit, n, problems, cap, params)
        assert (alone.key, alone.plan.layout_rules) == (
            joint.key,
            joint.plan.layout_rules,
        ), (alone.key, joint.key)
        chosen = "/".join(joint.key) if joint.plan.cost.fits else "nothing fits"
        first = "/".join(fit_key) if fits else "nothing fits"
        rows.append(
            [
                f"{label} ({cap:,} B)",
                chosen,
                f"{joint.time_s:.4f}" if joint.plan.cost.fits else "",
                f"{t_joint:.3f}",
                joint.plan.solver.num_solves,
                f"{t_alone:.3f}",
                f"{first} {fit_time:.4f}" if fits else first,
                f"{t_first:.3f}",
            ]
        )
        print(rows[-1], flush=True)
    print()
    print(
        f"GPT-3-shaped stage, {args.layers} layers, micro-batch {args.batch}, "
        f"{args.mesh}, {args.hardware}; {machine_summary()}"
    )
    print()
    print(
        markdown_table(
            [
                "capacity per device",
                "joint: option",
                "stage step (s)",
                "joint (s)",
                "solves",
                "each alone (s)",
                "first fit: option, step (s)",
                "first fit (s)",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()

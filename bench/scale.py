"""Plans for reference models at scale, beside their published layouts.

For each model: ``layout_planner.choices.plan_transformer`` searches pipeline
stages x data x tensor sizes and recomputation for the device count (bfloat16
activations, float32 master weights and Adam slots, shardable weights), and
the layout its authors published is priced by the same cost model
(``price_layout``).  Prints (and with ``--write`` puts in
docs/benchmarks.md, section ``scale``) the plan, predicted step time, MFU
(model flops / (devices x peak x step)), peak memory per device and the
planning time.

    .venv/bin/python bench/scale.py [--write] [--only gpt3,llama64,...]
        [--quick] [--exhaustive] [--timeline] [--sequence 1,2]

The planning time is ``plan_transformer``'s wall clock: the full mesh search
on representative stage graphs and the winner's check on its full stage
graph (``--exhaustive``: every trial on its full stage graph).
``--sequence 1,2``: the search tries a sequence axis of those sizes too
(section ``scale-sequence`` with ``--write``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.common import replace_section  # noqa: E402
from layout_planner.choices import (  # noqa: E402
    ScaleChoice,
    ScaleError,
    ScalePlan,
    plan_transformer,
    price_layout,
)
from layout_planner.errors import PlannerError, SolverError  # noqa: E402
from mtf_core.models import TransformerConfig  # noqa: E402

MEGATRON = "batch:dp;heads:tp;d_ff:tp;vocab:tp"
#: Megatron-LM's distributed optimizer (NeMo's distributed_fused_adam):
#: optimizer slots only sharded over the data axis, for every weight class.
DISTRIBUTED_OPTIMIZER = ";".join(
    f"d_model_slots_{c}:dp" for c in ("self_attention", "ffn", "embedding", "logits")
)


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    config: TransformerConfig
    devices: int
    hardware: str
    published: ScaleChoice
    published_rules: str
    source: str
    encoder_decoder: bool = False

    def plan(self, workers: int) -> ScalePlan:
        """The model planned with ``plan_transformer``'s defaults on
        ``workers`` processes."""
        return plan_transformer(
            self.config,
            self.devices,
            self.hardware,
            encoder_decoder=self.encoder_decoder,
            workers=workers,
        )

    def price_published(self) -> ScalePlan:
        """The published layout priced as the planner's trials are."""
        return price_layout(
            self.config,
            self.published,
            self.published_rules,
            self.hardware,
            encoder_decoder=self.encoder_decoder,
        )


def selected(only: str) -> list[Case]:
    """The cases ``--only`` names (comma-separated keys; empty: all)."""
    keys = [k for k in only.split(",") if k]
    return [c for c in CASES if not keys or c.key in keys]


def selected_or_error(ap: argparse.ArgumentParser, only: str) -> list[Case]:
    """:func:`selected`, or ``ap``'s usage error where ``--only`` names no
    case."""
    cases = selected(only)
    if not cases:
        ap.error(f"--only {only!r} names no case")
    return cases


GPT3 = TransformerConfig(
    num_layers=96, d_model=12288, heads=96, d_kv=128, d_ff=49152, vocab=51200,
    length=2048, batch=1536, activation="gelu", activation_dtype="bfloat16",
)  # fmt: skip
LLAMA2_70B = TransformerConfig(
    num_layers=80, d_model=8192, heads=64, d_kv=128, d_ff=28672, vocab=32000,
    length=4096, batch=1024, activation="silu", norm="rms_norm",
    activation_dtype="bfloat16",
)  # fmt: skip
MOE = TransformerConfig(
    num_layers=24, d_model=2048, heads=16, d_kv=128, d_ff=8192, vocab=32000,
    length=2048, batch=512, experts=64, activation_dtype="bfloat16",
)  # fmt: skip
T5_11B = TransformerConfig(
    num_layers=24, d_model=1024, heads=128, d_kv=128, d_ff=65536, vocab=32128,
    length=512, batch=2048, activation="relu", activation_dtype="bfloat16",
)  # fmt: skip


def _published(pp: int, dp: int, tp: int, batch: int, attn: str, ffn: str):
    return ScaleChoice(pp, dp, tp, batch // dp, "1f1b", attn, ffn)


CASES = [
    Case(
        "gpt3",
        "GPT-3 175B, 1,024 A100 80 GB (8 per host)",
        GPT3,
        1024,
        "a100-nvlink-ib",
        _published(16, 8, 8, 1536, "block", "block"),
        MEGATRON + ";" + DISTRIBUTED_OPTIMIZER,
        "Megatron-LM `examples/gpt3/train_gpt3_175b_distributed.sh`: tensor 8, "
        "pipeline 16, micro-batch 1, global batch 1536 (data 8 on 1,024 GPUs; "
        "the README gives ~32 s per step there); full recomputation as in "
        "Narayanan et al. 2021; the README's distributed optimizer "
        "(`--use-distributed-optimizer`) priced as slots-only sharding over data",
    ),
    Case(
        "llama64",
        "Llama-2-70B shape, 64 H100",
        LLAMA2_70B,
        64,
        "h100-nvlink-ib",
        _published(4, 4, 4, 1024, "scores", "none"),
        MEGATRON + ";" + DISTRIBUTED_OPTIMIZER,
        "NeMo-Framework-Launcher `conf/training/llama/llama2_70b.yaml`: tensor 4, "
        "pipeline 4 (virtual 20), micro-batch 1, sequence parallel, no "
        "activation checkpointing, FlashAttention (priced as core attention "
        "recomputed: its backward recomputes the scores), distributed_fused_adam "
        "(slots-only sharding over data)",
    ),
    Case(
        "llama512",
        "Llama-2-70B shape, 512 H100",
        LLAMA2_70B,
        512,
        "h100-nvlink-ib",
        _published(4, 32, 4, 1024, "scores", "none"),
        MEGATRON + ";" + DISTRIBUTED_OPTIMIZER,
        "same NeMo configuration (tensor 4, pipeline 4) with data 32",
    ),
    Case(
        "t5",
        "T5-11B shape, TPU v4 4x4x4 (64 chips)",
        T5_11B,
        64,
        "tpu-v4",
        _published(1, 8, 8, 2048, "none", "none"),
        MEGATRON,
        "T5 `notebooks/t5-trivia.ipynb`: model_parallelism 8 for 11B, with "
        "`t5/models/mtf_model.py`'s default rules (batch:batch, d_ff, heads, "
        "vocab:model); no pipeline",
        encoder_decoder=True,
    ),
    Case(
        "moe",
        "MoE (24 layers, d_model 2048, 64 experts, top-1), 256 H100",
        MOE,
        256,
        "h100-nvlink-ib",
        _published(1, 64, 4, 512, "none", "none"),
        MEGATRON + ";experts:dp",
        "Mesh TensorFlow / T5 `t5/models/mtf_model.py` default rules "
        "(experts:batch, i.e. experts over the data axis; d_ff, heads, vocab "
        "over the model axis), here batch 64 x model 4",
    ),
]


def _row(plan, planning: float | None) -> list[str]:
    c = plan.choice
    return [
        f"pp {c.stages} x dp {c.data} x "
        + (f"sp {c.sequence} x " if c.sequence > 1 else "")
        + f"tp {c.tensor}, m {c.micro_batches}",
        f"{c.recompute_attention}/{c.recompute_ffn}",
        ", ".join(plan.sharded_classes) or "none",
        ", ".join(getattr(plan, "slot_sharded_classes", ())) or "none",
        f"{plan.step_time_s:.2f}",
        f"{plan.mfu:.1%}",
        f"{plan.peak_memory_bytes / 2**30:.1f}",
        "yes" if plan.fits else "no",
        "" if planning is None else f"{planning:.1f} ({len(plan.trials)} trials)",
    ]


def run(
    cases: list[Case],
    quick: bool = False,
    exhaustive: bool = False,
    timeline: bool = False,
    sequence: tuple[int, ...] = (1,),
) -> str:
    header = (
        "| model | layout | mesh (pp x dp x tp, micro-batches) | recompute "
        "attn/ffn | ZeRO-sharded classes | slots-only sharded classes | step s | "
        "MFU | peak GiB | fits | planning s |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [header]
    notes = []
    for case in cases:
        start = time.perf_counter()
        ours = None
        try:
            pub = case.published
            narrow = {}
            if quick:  # the published sizes and their neighbours only
                narrow = {
                    # an encoder-decoder has one stage
                    "stages": [1] if case.encoder_decoder else sorted(
                        {s for s in (pub.stages // 2, pub.stages, pub.stages * 2)
                         if s >= 1 and case.config.num_layers % s == 0}
                    ),
                    "tensor": sorted({max(1, pub.tensor // 2), pub.tensor,
                                      pub.tensor * 2}),
                }  # fmt: skip
            ours = plan_transformer(
                case.config,
                case.devices,
                case.hardware,
                encoder_decoder=case.encoder_decoder,
                exhaustive=exhaustive,
                progress=_timeline(start) if timeline else None,
                sequence=sequence,
                **narrow,
            )
            planning = time.perf_counter() - start
            rows.append(
                f"| {case.title} | planned | " + " | ".join(_row(ours, planning)) + " |"
            )
            print(case.title, f"planned in {planning:.1f} s", flush=True)
            rep = [t for t in ours.trials if t.choice == ours.choice][-1]
            print(
                f"  representative: step {rep.step_time_s!r} s, peak "
                f"{rep.peak_memory_bytes:,} B; full stage graph (evaluate): step "
                f"{ours.step_time_s!r} s, peak {ours.peak_memory_bytes:,} B",
                flush=True,
            )
            print(ours.explain(), flush=True)
            if sequence != (1,):
                notes.append(_with_sequence(case, ours))
        except ScaleError as e:
            planning = time.perf_counter() - start
            rows.append(
                f"| {case.title} | planned | no plan fits: {e} ||||||||{planning:.1f}|"
            )
            print(case.title, "no plan:", e, flush=True)
        try:
            pub = case.price_published()
        except (PlannerError, SolverError) as e:
            rows.append(f"| | published | not priced: {e} |||||||||")
            continue
        rows.append("| | published | " + " | ".join(_row(pub, None)) + " |")
        note = f"* {case.title}: published layout from {case.source}."
        if case.encoder_decoder:
            note += (
                " An encoder-decoder is planned on one stage (docs/scale.md, "
                '"An encoder-decoder is planned on one stage").'
            )
        notes.append(note)
        print("published:", pub.explain(), flush=True)
    return "\n".join(rows) + "\n\n" + "\n".join(notes)


def _with_sequence(case: Case, plan) -> str:
    """The fastest fitting trial on a sequence axis, beside the plan."""
    ran = [t for t in plan.trials if t.choice.sequence > 1]
    fitting = [t for t in ran if t.fits and t.step_time_s is not None]
    if not fitting:
        return (
            f"* {case.title}: {len(ran)} trials on a sequence axis, none fitting "
            f"(the plan: {plan.step_time_s:.2f} s)."
        )
    best = min(fitting, key=lambda t: t.step_time_s)
    c = best.choice
    return (
        f"* {case.title}: {len(ran)} trials on a sequence axis; the fastest "
        f"fitting, pp {c.stages} x dp {c.data} x sp {c.sequence} x tp {c.tensor}, "
        f"m {c.micro_batches}, recompute {c.recompute_attention}/"
        f"{c.recompute_ffn}, {best.step_time_s:.2f} s (the plan: "
        f"{plan.step_time_s:.2f} s; rules {best.layout_rules})."
    )


def _timeline(start: float):
    """A progress callback printing each phase with the seconds since
    ``start``: the passes report a mesh when they take its result."""

    def report(phase: str, fraction: float) -> None:
        print(f"  {time.perf_counter() - start:6.2f} s  {phase}", flush=True)

    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--only", default="", help="comma-separated case keys")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="search only the published pipeline and tensor sizes, halved and doubled",
    )
    ap.add_argument(
        "--exhaustive",
        action="store_true",
        help="plan every trial on its full stage graph (the slow search)",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="print each phase of the search with the seconds since its start",
    )
    ap.add_argument(
        "--sequence",
        default="1",
        help="comma-separated sequence-axis sizes to search (default: 1, none)",
    )
    args = ap.parse_args()
    try:
        sequence = tuple(int(s) for s in args.sequence.split(","))
    except ValueError:
        ap.error(f"--sequence {args.sequence!r}: expected integers such as 1,2")
    cases = selected(args.only)
    load_start = os.getloadavg()[0]
    table = run(cases, args.quick, args.exhaustive, args.timeline, sequence)
    load = f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    print(table)
    print(load)
    if args.write:
        flags = (" --quick" if args.quick else "") + (
            " --exhaustive" if args.exhaustive else ""
        )
        with_sp = sequence != (1,)
        if with_sp:
            flags += f" --sequence {args.sequence}"
        cmd = f"`.venv/bin/python bench/scale.py --write{flags}`"
        replace_section(
            "scale-sequence" if with_sp else "scale",
            f"Command: {cmd} ({load}, 2 cores).\n\n{table}",
            title="Scale with a sequence axis"
            if with_sp
            else "Scale: reference models on their clusters",
        )


if __name__ == "__main__":
    main()

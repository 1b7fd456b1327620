"""Building stage graphs, against an earlier commit, alternating.

The scale search builds a small stage graph per micro-batch size and
recomputation option, and checks its winner on the full stage graph: for
T5-11B that is the whole 48-layer encoder-decoder with Adam (about 21,000
ops), built while the other worker waits.  Times:

* ``build_encoder_decoder`` of that graph;
* ``build_lm`` of GPT-3's 2-layer stage graph;
* ``build_lm`` of the 10-layer stage that Llama-2-70B on 64 H100 is checked
  on, every attention and feed-forward block recomputed;
* beyond the search, GPT-3's whole 96-layer graph with every block
  recomputed, and a pipelined step of 8 stages and 16 micro-batches
  (``mtf_core.pipeline.build_pipelined_lm``): graphs whose backward passes
  (one per block, one per stage and micro-batch) walked the whole graph
  each before ``mtf.gradients`` walked only what they differentiate.

Each figure is the least CPU seconds of ``--repeats`` builds (ten times as
many of the 2-layer graph) in a fresh interpreter, with the cyclic
collector paused as the search pauses it, by the tree of ``--base`` and by
this one in turn; both trees must build the same ops.  Prints (and with
``--write`` puts in docs/benchmarks.md, section ``graph-build``) the
medians and their ratio.

    .venv/bin/python bench/graph_build.py --base REV [--runs 4] [--repeats 3]
        [--write]
"""

from __future__ import annotations

import argparse
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
)

# Run in a fresh interpreter with the tree's root first on sys.path.
_CHILD = """
import hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
from bench.scale import CASES
from cost_models.gc_pause import gc_paused
from layout_planner.choices import ScaleChoice
from layout_planner.scale_plan import stage_config_for
from mtf_core.models.transformer import build_encoder_decoder, build_lm
from mtf_core.pipeline import PipelineStages, build_pipelined_lm
cases = {c.key: c for c in CASES}

def pipelined(cfg, optimizer):
    return build_pipelined_lm(cfg, PipelineStages(8, 16, "1f1b"), optimizer)

graphs = {
    "t5": (build_encoder_decoder, stage_config_for(
        cases["t5"].config, ScaleChoice(1, 16, 4, 64, "1f1b", "none", "none"),
        cases["t5"].config.num_layers)),
    "gpt3": (build_lm, stage_config_for(
        cases["gpt3"].config, ScaleChoice(16, 16, 4, 96, "1f1b", "none", "none"), 2)),
    "llama64": (build_lm, stage_config_for(
        cases["llama64"].config, ScaleChoice(8, 8, 1, 128, "1f1b", "block", "block"),
        cases["llama64"].config.num_layers // 8)),
    "deep": (build_lm, cases["gpt3"].config.replace(
        recompute_attention="block", recompute_ffn="block", shardable_weights=True)),
    "pipeline": (pipelined, cases["llama64"].config.replace(
        num_layers=16, shardable_weights=True)),
}
out = {}
for key, (build, cfg) in graphs.items():
    best = float("inf")
    with gc_paused():
        # a 2-layer graph builds in a hundredth of a second: more tries
        for _ in range(int(sys.argv[2]) * (10 if key == "gpt3" else 1)):
            start = time.process_time()
            model = build(cfg, optimizer="adam")
            best = min(best, time.process_time() - start)
    ops = [(op.op_type, op.name, [str(t.shape) for t in op.outputs])
           for op in model.graph.operations]
    digest = hashlib.sha256(json.dumps(ops).encode()).hexdigest()[:12]
    out[key] = [best, len(ops), digest]
print(json.dumps(out))
"""

_TITLES = {
    "t5": "T5-11B stage, 24 + 24 layers (the winner's check)",
    "gpt3": "GPT-3 stage graph, 2 layers (a representative)",
    "llama64": (
        "Llama-2-70B on 64 H100, 10 layers, whole blocks recomputed "
        "(the winner's check)"
    ),
    "deep": "GPT-3, all 96 layers, whole blocks recomputed (one graph)",
    "pipeline": (
        "Llama-2-70B shape, 16 layers in 8 stages of 16 micro-batches "
        "(a pipelined step)"
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--base", required=True, type=base_commit, help="the commit to compare with"
    )
    ap.add_argument("--runs", type=int, default=4, help="interpreters per tree")
    ap.add_argument("--repeats", type=int, default=3, help="builds per interpreter")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    for name in ("runs", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: expected at least 1")
    base = args.base
    machine = machine_summary()
    got: dict[str, list[dict[str, list]]] = {"this": [], "base": []}
    with commit_tree(base) as tree:
        for run in range(args.runs):
            for who, root in (("base", tree), ("this", str(ROOT))):
                one = child_json(
                    _CHILD, [root, str(args.repeats)], f"builds in {root}", root
                )
                got[who].append(one)
                print(f"run {run + 1}/{args.runs} {who}: " + ", ".join(
                    f"{k} {v[0]:.3f} s" for k, v in one.items()), flush=True)  # fmt: skip
    rows = []
    for key, title in _TITLES.items():
        mine, theirs = ([r[key][0] for r in got[who]] for who in ("this", "base"))
        m, b = statistics.median(mine), statistics.median(theirs)
        shapes = {r[key][2] for who in got for r in got[who]}
        ops = {r[key][1] for who in got for r in got[who]}
        rows.append([
            title, "/".join(map(str, sorted(ops))), f"{m:.3f}", f"{b:.3f}",
            f"{m / b:.2f}", "yes" if len(shapes) == 1 else "NO",
        ])  # fmt: skip
    headers = [
        "graph", "ops", "this tree, median CPU s", f"base ({base}), median CPU s",
        "ratio", "same ops",
    ]  # fmt: skip
    body = (
        f"Command: `{command_line()}` ({machine}; each tree's builds in a fresh "
        "interpreter, the two trees in turn; a run's figure is its fastest "
        "build).\n\n" + markdown_table(headers, rows) + "\n"
    )
    print(body)
    if args.write:
        replace_section("graph-build", body, title="Building stage graphs")


if __name__ == "__main__":
    main()

"""What a pipeline stage holds per in-flight micro-batch, checked by hand.

A 1F1B stage with ``k`` micro-batches in flight peaks at its own peak plus
``k - 1`` times what one micro-batch holds between its forward and backward
pass: with whole blocks recomputed, each block's input (and the token ids
the embedding's gradient reads); not the weights' bfloat16 casts (the same
for every micro-batch) and not the last stage's head (logits and loss),
whose backward runs right after its forward.
"""

from __future__ import annotations

import pytest

from cost_models import evaluate, get_hardware
from cost_models.memory import memory_model
from cost_models.pipeline import (
    PipelineError,
    PipelineSpec,
    held_bytes_per_micro_batch,
    pipeline_cost,
    split_step,
)
from layout_planner.choices import ScaleChoice, price_layout
from mtf_core.comm import LayoutContext
from mtf_core.models import TransformerConfig, build_lm

HW = get_hardware("h100-nvlink-ib")
MESH = "dp:4;tp:2"
RULES = "batch:dp;d_ff:tp;heads:tp;vocab:tp"
CFG = TransformerConfig(
    num_layers=2, d_model=32, heads=4, d_kv=8, d_ff=64, vocab=64, length=16,
    batch=8, recompute_attention="block", recompute_ffn="block",
)  # fmt: skip


def _held(cfg: TransformerConfig, with_head: bool = False) -> tuple[int, object]:
    model = build_lm(cfg, optimizer="adam")
    ops = model.graph.operations
    first_backward = 1 + next(i for i, o in enumerate(ops) if o is model.loss.operation)
    head = next(i for i, o in enumerate(ops) if o.name == "final_norm_scale")
    ctx = LayoutContext.make(MESH, RULES)
    memory = memory_model(model.graph, [model.loss])
    held = held_bytes_per_micro_batch(
        model.graph, memory, ctx, first_backward, None if with_head else head
    )
    return held, model


def test_whole_block_recompute_holds_the_block_inputs_and_token_ids() -> None:
    held, _ = _held(CFG)
    # Per device: batch 8 / dp 4 = 2 sequences of 16 tokens.  Four blocks
    # (attention and ffn of two layers) keep their float32 input
    # [2, 16, d_model 32]; the embedding's gradient reads the int32 ids [2, 16].
    block_input = 2 * 16 * 32 * 4
    ids = 2 * 16 * 4
    assert held == 4 * block_input + ids == 16512
    # bfloat16 activations halve the block inputs; the weights' bfloat16
    # casts are not per micro-batch and are not counted.
    held_bf16, _ = _held(CFG.replace(activation_dtype="bfloat16"))
    assert held_bf16 == 4 * (2 * 16 * 32 * 2) + ids
    # The head (final norm, logits, loss) would add its saved tensors.
    assert _held(CFG, with_head=True)[0] > held


def test_the_pipelined_peak_adds_the_held_bytes_of_the_others_in_flight() -> None:
    held, model = _held(CFG)
    cost = evaluate(model.graph, MESH, RULES, HW, [model.loss])
    ctx = LayoutContext.make(MESH, RULES)
    first = next(
        i for i, op in enumerate(model.graph.operations) if op.name == "global_step"
    )
    split = split_step(model.graph, cost, ctx, HW, first)
    p = pipeline_cost(
        PipelineSpec(4, 8), split, cost.peak_memory_bytes, held, HW.memory_bytes,
        1024, ("pp",), "pp:4;dp:4;tp:2", HW,
    )  # fmt: skip
    assert p.peak_memory_bytes == cost.peak_memory_bytes + 3 * 16512
    assert p.held_bytes == 16512
    # Far less than the old bound, the whole activation peak per micro-batch.
    assert held < cost.activation_peak_bytes / 2


def test_price_layout_charges_the_held_bytes() -> None:
    cfg = CFG.replace(num_layers=4)
    # 2 stages of 2 layers, 2 micro-batches of 4 sequences (1 per dp device):
    # the stage graph is CFG's with batch 4, so each block input is
    # [1, 16, 32] float32 per device, the ids [1, 16] int32.
    choice = ScaleChoice(2, 4, 2, 2, "1f1b", "block", "block")
    plan = price_layout(cfg, choice, RULES, HW)
    p = plan.pipeline
    assert p.held_bytes == 4 * (16 * 32 * 4) + 16 * 4
    stage = plan.stage_plan.evaluation
    assert stage is not None
    assert p.peak_memory_bytes == stage.peak_memory_bytes + 1 * p.held_bytes


def test_held_bytes_refuses_indices_outside_the_graph() -> None:
    model = build_lm(CFG, optimizer="adam")
    ctx = LayoutContext.make(MESH, RULES)
    memory = memory_model(model.graph, [model.loss])
    n = len(model.graph.operations)
    with pytest.raises(PipelineError, match=f"{n + 5}"):
        held_bytes_per_micro_batch(model.graph, memory, ctx, n + 5)
    with pytest.raises(PipelineError, match="head start 9"):
        held_bytes_per_micro_batch(model.graph, memory, ctx, 3, 9)

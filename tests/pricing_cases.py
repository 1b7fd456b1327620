"""A small language model shared by the unit-pricing tests: shardable weights
and slots, bfloat16 activations, Adam, and its analysis with the update's ops
running once per step."""

from __future__ import annotations

from cost_models.profiles import get_hardware
from layout_planner.analysis import GraphAnalysis
from mtf_core.models import TransformerConfig, build_lm
from mtf_core.models.base import ModelGraph

CFG = TransformerConfig(
    num_layers=2, d_model=64, heads=4, d_kv=16, d_ff=128, vocab=256,
    length=16, batch=8, activation_dtype="bfloat16",
    shardable_weights=True, shardable_slots=True,
)  # fmt: skip
HW = get_hardware("h100-nvlink-ib")


def small_model() -> tuple[ModelGraph, GraphAnalysis]:
    """CFG's model with Adam, and its analysis."""
    m = build_lm(CFG, optimizer="adam")
    update = next(
        i for i, op in enumerate(m.graph.operations) if op.name == "global_step"
    )
    return m, GraphAnalysis(m.graph, [m.loss], once_from=update)

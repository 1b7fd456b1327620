"""Recomputation per block class: lowered for real, priced exactly.

Each option (keep all, recompute the attention scores, the attention block,
the feed-forward block, both blocks) trains to the same values as keeping
everything; the lowering's collectives and flops equal ``evaluate``'s, and so
do the compiled step's (which lowers only what the loss and the updates need:
a recomputed block's output is not), the recomputed forward is in both (more
flops), and the held activations shrink.
"""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from cost_models import evaluate
from mtf_core.errors import ConfigError
from mtf_core.liveness import step_targets
from mtf_core.models import TransformerConfig, build_lm

MESH = "dp:4;tp:2"
RULES = "batch:dp;d_ff:tp;heads:tp;d_model_stored_ffn:dp"
CFG = TransformerConfig(
    num_layers=2,
    d_model=32,
    heads=4,
    d_kv=8,
    d_ff=64,
    vocab=64,
    length=16,
    batch=8,
    shardable_weights=True,
)
OPTIONS = [
    ("none", "none"),
    ("scores", "none"),
    ("block", "none"),
    ("block", "block"),
]


def _ids() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(1)
    return (
        rng.randint(0, 64, size=(8, 16)).astype(np.int32),
        rng.randint(0, 64, size=(8, 16)).astype(np.int32),
    )


def specs(collectives) -> list[tuple[str, tuple[str, ...], int]]:
    return [(c.kind, tuple(c.mesh_axes), c.bytes_per_device) for c in collectives]


@pytest.mark.tf
@pytest.mark.slow
def test_each_recompute_option_lowers_as_priced_and_trains_to_the_same_values(
    devices: list[str],
) -> None:
    inputs, targets = _ids()
    results = {}
    for attn, ffn in OPTIONS:
        cfg = CFG.replace(recompute_attention=attn, recompute_ffn=ffn)
        model = build_lm(cfg, optimizer="adam", learning_rate=3e-3)
        feeds = {model.inputs["inputs"]: inputs, model.inputs["targets"]: targets}
        impl = mtf.PlacementMeshImpl(MESH, RULES, devices)
        lowering = mtf.Lowering(
            model.graph,
            {model.mesh: impl},
            feeds=feeds,
            targets=step_targets(model.graph, [model.loss]),
        )
        cost = evaluate(model.graph, MESH, RULES, "h100-nvlink-ib", [model.loss])
        assert specs(lowering.counters.collectives) == specs(cost.collectives)
        assert lowering.counters["flops_per_device"] == pytest.approx(
            cost.flops_per_device, rel=1e-12
        )
        step = mtf.compile_function(
            model.graph,
            {model.mesh: mtf.PlacementMeshImpl(MESH, RULES, devices)},
            inputs=model.placeholders,
            outputs=[model.loss],
            updates=model.updates,
        )
        losses = [float(step(inputs, targets)[0]) for _ in range(2)]
        assert specs(step.counters.collectives) == specs(cost.collectives)
        assert step.counters["flops_per_device"] == pytest.approx(
            cost.flops_per_device, rel=1e-12
        )
        results[(attn, ffn)] = (losses, cost)
    keep, keep_cost = results[("none", "none")]
    assert keep[1] < keep[0]
    for option, (losses, cost) in results.items():
        np.testing.assert_allclose(losses, keep, rtol=1e-5, err_msg=str(option))
        if option != ("none", "none"):
            assert cost.flops_per_device > keep_cost.flops_per_device, option
            assert cost.activation_peak_bytes < keep_cost.activation_peak_bytes, option
    both = results[("block", "block")][1]
    # Recomputing both blocks holds the least, and runs the most flops.
    assert both.activation_peak_bytes == min(
        c.activation_peak_bytes for _, c in results.values()
    )
    assert both.flops_per_device == max(c.flops_per_device for _, c in results.values())


@pytest.mark.tf
def test_whole_block_recompute_is_priced_as_the_compiled_step_runs_it(
    devices: list[str],
) -> None:
    """A recomputed block's output (its output einsum and the allreduce over
    tp after it) is recomputed for nothing: the backward pass reads the
    block's inputs.  The compiled step does not lower it, and ``evaluate``
    prices what the step runs, not every op of the graph."""
    cfg = CFG.replace(recompute_attention="block", recompute_ffn="block")
    model = build_lm(cfg, optimizer="adam", learning_rate=3e-3)
    step = mtf.compile_function(
        model.graph,
        {model.mesh: mtf.PlacementMeshImpl(MESH, RULES, devices)},
        inputs=model.placeholders,
        outputs=[model.loss],
        updates=model.updates,
    )
    step.trace()
    cost = evaluate(model.graph, MESH, RULES, "h100-nvlink-ib", [model.loss])
    assert specs(step.counters.collectives) == specs(cost.collectives)
    assert step.counters["flops_per_device"] == pytest.approx(
        cost.flops_per_device, rel=1e-12
    )
    # The whole graph lowered: two allreduces over tp more per layer (the
    # attention and feed-forward outputs), and their einsums' flops.
    inputs, targets = _ids()
    whole = mtf.Lowering(
        model.graph,
        {model.mesh: mtf.PlacementMeshImpl(MESH, RULES, devices)},
        feeds={model.inputs["inputs"]: inputs, model.inputs["targets"]: targets},
    )
    tp = [("tp",) == tuple(c.mesh_axes) for c in whole.counters.collectives]
    priced_tp = [("tp",) == tuple(c.mesh_axes) for c in cost.collectives]
    assert sum(tp) - sum(priced_tp) == 2 * cfg.num_layers
    assert len(whole.counters.collectives) - len(cost.collectives) == 2 * cfg.num_layers
    assert whole.counters["flops_per_device"] > 1.05 * cost.flops_per_device


def test_recompute_options_are_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="'everything'"):
        TransformerConfig(recompute_attention="everything")
    with pytest.raises(ConfigError, match="'scores'"):
        TransformerConfig(recompute_ffn="scores")
    with pytest.raises(ConfigError, match="dropout"):
        TransformerConfig(recompute_ffn="block", dropout_rate=0.1)

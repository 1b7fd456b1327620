"""The mixture-of-experts feed-forward layer with experts over the data axis:
the same values as one device, exactly the predicted collectives (the
dispatch and return all-to-alls over the data axis) and flops."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from cost_models import evaluate
from mtf_core.errors import ConfigError
from mtf_core.liveness import step_targets
from mtf_core.models import TransformerConfig, build_lm

CFG = TransformerConfig(
    num_layers=1, d_model=32, heads=4, d_kv=8, d_ff=64, vocab=64, length=16,
    batch=8, experts=4,
)  # fmt: skip
RULES = "batch:dp;experts:dp;d_ff:tp;heads:tp"


@pytest.mark.tf
def test_experts_over_the_data_axis_train_like_one_device(devices) -> None:
    rng = np.random.RandomState(0)
    ids = rng.randint(0, 64, size=(8, 16)).astype(np.int32)
    tg = rng.randint(0, 64, size=(8, 16)).astype(np.int32)
    losses = {}
    for mesh, rules in (("all:1", ""), ("dp:4;tp:2", RULES)):
        model = build_lm(CFG, optimizer="adam")
        n = mtf.convert_to_shape(mesh).size
        step = mtf.compile_function(
            model.graph,
            {model.mesh: mtf.PlacementMeshImpl(mesh, rules, devices[:n])},
            inputs=model.placeholders,
            outputs=[model.loss],
            updates=model.updates,
        )
        losses[mesh] = [float(step(ids, tg)[0]) for _ in range(2)]
        if n > 1:
            feeds = {model.inputs["inputs"]: ids, model.inputs["targets"]: tg}
            impl = mtf.PlacementMeshImpl(mesh, rules, devices[:n])
            # what the step lowers: the ops the loss and the updates need
            low = mtf.Lowering(
                model.graph,
                {model.mesh: impl},
                feeds=feeds,
                targets=step_targets(model.graph, [model.loss]),
            )
            cost = evaluate(model.graph, mesh, rules, "h100-nvlink-ib", [model.loss])
            got = [
                (c.kind, c.mesh_axes, c.bytes_per_device)
                for c in low.counters.collectives
            ]
            want = [(c.kind, c.mesh_axes, c.bytes_per_device) for c in cost.collectives]
            assert got == want
            assert low.counters["flops_per_device"] == cost.flops_per_device
            # dispatch and return, in the forward and the backward pass
            a2a = [c for c in got if c[0] == "alltoall"]
            assert len(a2a) == 4 and {c[1] for c in a2a} == {("dp",)}
    np.testing.assert_allclose(losses["dp:4;tp:2"], losses["all:1"], rtol=1e-5)
    assert losses["all:1"][1] < losses["all:1"][0]


def test_expert_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="experts"):
        TransformerConfig(experts=-1)
    with pytest.raises(ConfigError, match="expert_capacity_factor"):
        TransformerConfig(experts=4, expert_capacity_factor=0)

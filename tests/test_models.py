"""Models: the Transformer LM gives the same losses under every preset, and its
lowered communication is the one the layout implies."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from mtf_core.errors import ConfigError
from mtf_core.models import (
    MlpConfig,
    TransformerConfig,
    build_encoder_decoder,
    build_lm,
    build_mlp_classifier,
)
from mtf_core.presets import resolve_layout

CFG = TransformerConfig(
    num_layers=2, d_model=32, heads=8, d_kv=4, d_ff=64, vocab=64, length=16, batch=8
)
STEPS = 3
NAMES = {
    "batch",
    "length",
    "memory_length",
    "d_model",
    "heads",
    "d_kv",
    "d_ff",
    "vocab",
}


def _tokens(cfg: TransformerConfig, seed: int = 0) -> np.ndarray:
    rng = np.random.RandomState(seed)
    return rng.randint(1, cfg.vocab, size=(cfg.batch, cfg.length + 1)).astype(np.int32)


def _train(build, cfg, devices, layout, feeds, steps=STEPS):
    model = build(cfg, optimizer="sgd", learning_rate=0.5)
    if layout is None:
        impl = mtf.PlacementMeshImpl("all:1", "", devices[:1])
    else:
        choice = resolve_layout(layout, 8)
        impl = mtf.PlacementMeshImpl(choice.mesh_shape, choice.rules, devices)
    fn = mtf.compile_function(
        model.graph, {model.mesh: impl}, model.placeholders, [model.loss], model.updates
    )
    args = [feeds[n] for n in model.inputs]
    losses = [float(fn(*args)[0]) for _ in range(steps)]
    return model, fn, losses


@pytest.fixture(scope="module")
def lm_runs(devices):
    """One-device and preset runs of the LM, shared by the tests below."""
    tok = _tokens(CFG)
    feeds = {"inputs": tok[:, :-1], "targets": tok[:, 1:]}
    return {
        layout: _train(build_lm, CFG, devices, layout, feeds)
        for layout in (None, "data-parallel", "model-parallel", "2d")
    }


@pytest.mark.tf
@pytest.mark.parametrize("preset", ["data-parallel", "model-parallel", "2d"])
def test_lm_losses_under_each_preset_equal_the_one_device_losses(lm_runs, preset):
    one = lm_runs[None][2]
    assert one[-1] < one[0]  # it is training
    np.testing.assert_allclose(lm_runs[preset][2], one, rtol=2e-5)
    v1 = lm_runs[None][1].variables.to_dict()
    v2 = lm_runs[preset][1].variables.to_dict()
    assert v1.keys() == v2.keys()
    for name in v1:
        np.testing.assert_allclose(v2[name], v1[name], rtol=1e-3, atol=2e-5)


def _reduced(op) -> set[str]:
    """Names of the dims an op sums (or gathers) away."""
    dims = [op.dim] if op.op_type == "Gather" else op.reduced_dims
    return {d if isinstance(d, str) else d.name for d in dims}


@pytest.mark.tf
def test_model_parallel_allreduces_attention_and_ffn_outputs_over_the_model_axis(
    lm_runs,
):
    model, fn, _ = lm_runs["model-parallel"]
    reduces = fn.counters.of_kind("allreduce")
    assert reduces and {r.mesh_axes for r in reduces} == {("all",)}
    ops = [model.graph.operation_by_name(r.op_name) for r in reduces]
    einsum_sums = [_reduced(op) for op in ops if op.op_type == "Einsum"]
    # forward: attention output projection (heads, d_kv) and ffn output (d_ff),
    # once per layer each; backward adds the matching input gradients.
    assert einsum_sums.count({"heads", "d_kv"}) >= CFG.num_layers
    assert einsum_sums.count({"d_ff"}) >= 2 * CFG.num_layers
    for op in ops:  # nothing is reduced that the layout does not split
        assert _reduced(op) & {"heads", "d_ff", "vocab"}, op
        assert "batch" not in _reduced(op) or op.op_type != "Einsum"


@pytest.mark.tf
def test_data_parallel_allreduces_only_gradients(lm_runs):
    model, fn, _ = lm_runs["data-parallel"]
    reduces = fn.counters.of_kind("allreduce")
    assert reduces and {r.mesh_axes for r in reduces} == {("all",)}
    var_shapes = {v.shape for v in model.graph.trainable_variables}
    ops = [model.graph.operation_by_name(r.op_name) for r in reduces]
    for op in ops:
        assert "batch" in _reduced(op), op
    einsums = [op for op in ops if op.op_type == "Einsum"]
    assert einsums and all(op.outputs[0].shape in var_shapes for op in einsums)
    # one allreduce per weight matrix: the kernels and the embedding table
    matrices = [v for v in model.graph.trainable_variables if v.shape.ndims > 1]
    assert len(einsums) == len(matrices) - 1  # positions' gradient is a Reduce


@pytest.mark.tf
def test_2d_preset_reduces_batch_over_rows_and_model_dims_over_cols(lm_runs):
    model, fn, _ = lm_runs["2d"]
    for r in fn.counters.of_kind("allreduce"):
        dims = _reduced(model.graph.operation_by_name(r.op_name))
        if r.mesh_axes == ("rows",):
            assert "batch" in dims
        elif r.mesh_axes == ("cols",):
            assert dims & {"heads", "d_ff", "vocab"}
        else:
            assert r.mesh_axes == ("cols", "rows")
            assert "batch" in dims and dims & {"heads", "d_ff", "vocab"}
    assert fn.counters["allreduce/rows"] > 0 and fn.counters["allreduce/cols"] > 0


def test_lm_uses_the_named_dims_and_counts_its_parameters():
    model = build_lm(CFG)
    dims = {
        d.name for op in model.graph.operations for t in op.outputs for d in t.shape
    }
    assert dims <= NAMES
    assert [t.name for t in model.placeholders] == ["inputs:0", "targets:0"]
    assert not model.updates and model.logits.shape.dimension_names == [
        "batch",
        "length",
        "vocab",
    ]
    c = CFG
    per_layer = (
        4 * c.d_model * c.heads * c.d_kv + 2 * c.d_model * c.d_ff + 4 * c.d_model
    )
    embeddings = c.vocab * c.d_model + c.length * c.d_model + c.d_model * c.vocab
    assert model.num_parameters == c.num_layers * per_layer + embeddings + 2 * c.d_model


@pytest.mark.tf
def test_encoder_decoder_trains_identically_on_one_device_and_under_2d(devices):
    cfg = CFG.replace(num_layers=1)
    src, tgt = _tokens(cfg, 1), _tokens(cfg, 2)
    src[:, -3:] = 0  # padding, masked out of attention
    feeds = {
        "inputs": src[:, :-1],
        "decoder_inputs": tgt[:, :-1],
        "targets": tgt[:, 1:],
    }
    model, _, one = _train(build_encoder_decoder, cfg, devices, None, feeds, 2)
    _, _, two = _train(build_encoder_decoder, cfg, devices, "2d", feeds, 2)
    assert list(model.inputs) == ["inputs", "decoder_inputs", "targets"]
    assert one[1] < one[0]
    np.testing.assert_allclose(two, one, rtol=2e-5)


@pytest.mark.tf
def test_mlp_classifier_learns_a_separable_problem(devices):
    cfg = MlpConfig(batch=16, features=8, hidden=16, classes=2, num_hidden_layers=2)
    model = build_mlp_classifier(cfg, optimizer="adam", learning_rate=0.02)
    rng = np.random.RandomState(0)
    x = rng.randn(16, 8).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int32)
    impl = mtf.PlacementMeshImpl("all:2", "batch:all", devices[:2])
    fn = mtf.compile_function(
        model.graph, {model.mesh: impl}, model.placeholders, [model.loss], model.updates
    )
    losses = [float(fn(x, y)[0]) for _ in range(40)]
    assert losses[-1] < 0.3 * losses[0]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"heads": 0}, "heads must be a positive integer, got 0"),
        ({"activation": "tanhh"}, "'tanhh'"),
        ({"dropout_rate": 1.0}, "dropout_rate must be in"),
        ({"norm": "batch_norm"}, "'batch_norm'"),
    ],
)
def test_transformer_config_rejects_bad_values(changes, message):
    with pytest.raises(ConfigError, match=message):
        CFG.replace(**changes)


def test_transformer_config_round_trips_and_names_unknown_fields():
    assert TransformerConfig.from_dict(CFG.to_dict()) == CFG
    with pytest.raises(ConfigError, match="d_modle"):
        TransformerConfig.from_dict({"d_modle": 3})
    with pytest.raises(ConfigError, match="classes"):
        MlpConfig(classes=-1)

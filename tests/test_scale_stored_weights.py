"""Sharded (stored) weights and mixed precision: lowered, priced, planned.

* a stored weight split over the data axis is gathered on read and its
  gradient reduce-scattered: the placement lowering issues exactly the
  collectives ``cost_models.evaluate`` predicts (kind ``reducescatter`` among
  them), with the same flops, and trains to the same values as the plain
  layout;
* bfloat16 activations with float32 master weights and slots track the
  float32 losses within 2% over five Adam steps, with bfloat16 gradient
  collectives (half the bytes);
* the planner's tables price every layout of a small stored-weight graph
  exactly as ``evaluate`` does, its plan is optimal among them, and it shards
  weights only when memory requires it.
"""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from cost_models import evaluate, get_hardware
from layout_planner.problem import LayoutProblem
from mtf_core.errors import ConfigError, LayoutError
from mtf_core.liveness import step_targets
from mtf_core.models import TransformerConfig, build_lm
from mtf_core.ops.stored import stored_names
from mtf_core.ops.variables import as_variable

MESH = "dp:4;tp:2"
MEGATRON = "batch:dp;d_ff:tp;heads:tp"
CLASSES = ("self_attention", "ffn", "embedding", "logits")
ZERO = MEGATRON + ";" + ";".join(f"d_model_stored_{c}:dp" for c in CLASSES)
CFG = TransformerConfig(
    num_layers=2, d_model=32, heads=4, d_kv=8, d_ff=64, vocab=64, length=16, batch=8
)


def _ids() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    return {
        "inputs": rng.randint(0, 64, size=(8, 16)).astype(np.int32),
        "targets": rng.randint(0, 64, size=(8, 16)).astype(np.int32),
    }


def specs(collectives) -> list[tuple[str, tuple[str, ...], int]]:
    return [(c.kind, tuple(c.mesh_axes), c.bytes_per_device) for c in collectives]


def lowered(cfg: TransformerConfig, rules: str, devices: list[str]):
    """The model's one-step lowering (counters) and evaluate's prediction."""
    model = build_lm(cfg, optimizer="adam")
    ids = _ids()
    feeds = {model.inputs[k]: v for k, v in ids.items()}
    impl = mtf.PlacementMeshImpl(MESH, rules, devices)
    lowering = mtf.Lowering(
        model.graph,
        {model.mesh: impl},
        feeds=feeds,
        targets=step_targets(model.graph, [model.loss]),
    )
    cost = evaluate(model.graph, MESH, rules, "h100-nvlink-ib", outputs=[model.loss])
    return lowering.counters, cost


def losses(cfg: TransformerConfig, rules: str, devices: list[str], steps: int):
    model = build_lm(cfg, optimizer="adam", learning_rate=3e-3)
    impl = mtf.PlacementMeshImpl(MESH, rules, devices)
    step = mtf.compile_function(
        model.graph,
        {model.mesh: impl},
        inputs=model.placeholders,
        outputs=[model.loss],
        updates=model.updates,
    )
    ids = _ids()
    return [float(step(ids["inputs"], ids["targets"])[0]) for _ in range(steps)], step


@pytest.mark.tf
def test_stored_weights_lower_with_exactly_the_predicted_reduce_scatters(
    devices: list[str],
) -> None:
    counters, cost = lowered(CFG.replace(shardable_weights=True), ZERO, devices)
    assert specs(counters.collectives) == specs(cost.collectives)
    assert counters["flops_per_device"] == pytest.approx(cost.flops_per_device, 1e-12)
    scatters = counters.of_kind("reducescatter")
    # One per stored weight: q, k, v, o, wi, wo per layer, embedding,
    # positions and logits; each device contributes its whole (tp-split)
    # gradient, e.g. wi's [d_model 32, d_ff 64/2] float32.
    assert len(scatters) == 2 * 6 + 3
    assert all(c.mesh_axes == ("dp",) for c in scatters)
    wi = [c for c in scatters if "ffn_wi" in c.op_name or c.bytes_per_device == 4096]
    assert wi and all(c.bytes_per_device == 32 * 32 * 4 for c in wi)
    # Every read gathers the dp-split stored weight (allconcat over dp).
    gathers = [c for c in counters.of_kind("allconcat") if c.op_type == "StoredRead"]
    assert len(gathers) == 2 * 6 + 3 and {c.mesh_axes for c in gathers} == {("dp",)}
    # Weights and their Adam slots are stored 1/4 per device: less memory.
    _, plain = lowered(CFG, MEGATRON, devices)
    assert cost.param_bytes_per_device < plain.param_bytes_per_device / 3
    assert cost.slot_bytes_per_device < plain.slot_bytes_per_device / 3
    assert cost.peak_memory_bytes < plain.peak_memory_bytes


@pytest.mark.tf
def test_stored_weights_train_to_the_plain_layouts_values(devices: list[str]) -> None:
    plain, _ = losses(CFG, MEGATRON, devices, 3)
    zero, step = losses(CFG.replace(shardable_weights=True), ZERO, devices, 3)
    np.testing.assert_allclose(zero, plain, rtol=1e-5)
    assert plain[2] < plain[0]
    # The stored shards hold a quarter of the weight (and slots) per device.
    wi = next(
        v
        for v in step.variables.graph.all_variables
        if v.name.endswith("ffn_wi_kernel")
    )
    assert wi.shape.dimension_names[0] == "d_model_stored_ffn"
    assert step.variables.slices(wi)[0].shape == (32 // 4, 64 // 2)


@pytest.mark.tf
def test_unsplit_storage_names_cost_what_the_plain_layout_costs(
    devices: list[str],
) -> None:
    counters, cost = lowered(CFG.replace(shardable_weights=True), MEGATRON, devices)
    _, plain = lowered(CFG, MEGATRON, devices)
    assert specs(counters.collectives) == specs(cost.collectives)
    assert sorted(specs(cost.collectives)) == sorted(specs(plain.collectives))
    assert cost.param_bytes_per_device == plain.param_bytes_per_device


@pytest.mark.tf
def test_bfloat16_losses_track_float32_within_two_percent(devices: list[str]) -> None:
    f32, _ = losses(CFG, MEGATRON, devices, 5)
    bf16_cfg = CFG.replace(activation_dtype="bfloat16")
    bf16, step = losses(bf16_cfg, MEGATRON, devices, 5)
    np.testing.assert_allclose(bf16, f32, rtol=2e-2)
    assert bf16[4] < bf16[0]
    model = build_lm(bf16_cfg, optimizer="adam")
    assert {v.dtype for v in model.graph.all_variables if v.trainable} == {"float32"}
    assert model.loss.dtype == "float32" and model.logits.dtype == "float32"
    counters, cost = lowered(bf16_cfg, MEGATRON, devices)
    assert specs(counters.collectives) == specs(cost.collectives)
    _, f32_cost = lowered(CFG, MEGATRON, devices)
    # The weight gradients' allreduces over dp carry bfloat16: half the bytes.
    grads_bf16 = sorted(b for k, a, b in specs(cost.collectives) if a == ("dp",))
    grads_f32 = sorted(b for k, a, b in specs(f32_cost.collectives) if a == ("dp",))
    assert len(grads_bf16) == len(grads_f32)
    halved = sum(1 for x, y in zip(grads_bf16, grads_f32) if 2 * x == y)
    assert halved >= 2 * 6 + 3  # every large weight gradient
    assert cost.param_bytes_per_device == f32_cost.param_bytes_per_device
    assert cost.activation_peak_bytes < f32_cost.activation_peak_bytes


def test_training_dtypes_are_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="'int8'"):
        TransformerConfig(activation_dtype="int8")
    with pytest.raises(ConfigError, match="'fp8'"):
        TransformerConfig(master_dtype="fp8")
    assert TransformerConfig(activation_dtype="bfloat16").activation_dtype == "bfloat16"


# -- the planner ------------------------------------------------------------------


def stored_mlp():
    """x[batch, d] -> relu(x w1[d, h]) w2[h, c] with both weights stored under
    other names for d and h, bf16 activations, Adam."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.placeholder(m, "batch:8,d:8", dtype="bfloat16")
    vd = mtf.VariableDType("float32", "float32", "bfloat16")
    renames = {"w1": {"d": "d_stored"}, "w2": {"h": "h_stored"}}
    with stored_names(g, lambda name, shape: renames.get(name, {})):
        w1 = mtf.get_variable(m, "w1", "d:8,h:16", vd)
        w2 = mtf.get_variable(m, "w2", "h:16,c:4", vd)
    y = mtf.relu(mtf.einsum([x, w1], output_shape="batch:8,h:16"))
    logits = mtf.einsum([y, w2], output_shape="batch:8,c:4")
    loss = mtf.reduce_mean(mtf.square(mtf.to_float(logits)))
    variables = [as_variable(w1), as_variable(w2)]
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    mtf.optimize.AdamWeightDecayOptimizer(0.01).apply_grads(grads, variables)
    return g, loss


def every_layout(graph, loss, mesh, problem):
    import itertools

    names = ["batch", "c", "d", "d_stored", "h", "h_stored"]
    axes = [d.name for d in mtf.convert_to_shape(mesh)]
    out = []
    for choice in itertools.product([None, *axes], repeat=len(names)):
        text = ";".join(f"{d}:{a}" for d, a in zip(names, choice) if a)
        rules = mtf.convert_to_layout_rules(text)
        table = problem.table_cost(problem.assignment_from_rules(rules))
        try:
            cost = evaluate(graph, mesh, rules, HW, [loss], memory=problem.memory)
        except LayoutError:
            assert table.invalid, text
            continue
        assert not table.invalid, (text, table.invalid)
        assert table.time_s == pytest.approx(cost.time_s, rel=1e-9), text
        assert table.peak_bytes == cost.peak_memory_bytes, text
        out.append((text, cost))
    return out


HW = get_hardware("h100-nvlink-ib")


@pytest.mark.solver
def test_planner_prices_stored_weights_exactly_and_its_plan_is_optimal() -> None:
    graph, loss = stored_mlp()
    mesh = "x:2;y:4"
    problem = LayoutProblem(graph, mtf.convert_to_shape(mesh), HW, [loss])
    layouts = every_layout(graph, loss, mesh, problem)
    assert any("d_stored" in t for t, _ in layouts)
    peaks = sorted(c.peak_memory_bytes for _, c in layouts)
    for limit in (None, peaks[len(peaks) // 8]):
        plan = mtf.auto_layout(graph, mesh, [loss], HW, memory_limit=limit, top_k=1)
        fitting = [
            c.time_s
            for _, c in layouts
            if limit is None or (c.peak_memory_bytes <= limit)
        ]
        assert plan.cost.time_s == pytest.approx(min(fitting), rel=1e-9)
        assert limit is None or plan.cost.peak_memory_bytes <= limit


@pytest.mark.solver
def test_planner_shards_weights_over_the_data_axis_when_memory_requires() -> None:
    cfg = TransformerConfig(
        num_layers=2,
        d_model=1024,
        heads=8,
        d_kv=128,
        d_ff=4096,
        vocab=1024,
        length=64,
        batch=512,
        activation_dtype="bfloat16",
    )
    plain = build_lm(cfg, optimizer="adam")
    zero = build_lm(cfg.replace(shardable_weights=True), optimizer="adam")
    free = mtf.auto_layout(plain.graph, "x:8", [plain.loss], HW, top_k=1)
    assert str(free.layout_rules) == "batch:x"  # many tokens: data parallel
    limit = int(free.cost.peak_memory_bytes * 0.8)
    tight_plain = mtf.auto_layout(
        plain.graph, "x:8", [plain.loss], HW, memory_limit=limit, top_k=1
    )
    tight = mtf.auto_layout(
        zero.graph, "x:8", [zero.loss], HW, memory_limit=limit, top_k=1
    )
    assert not tight_plain.cost.fits  # replicated weights and slots do not fit
    assert tight.cost.fits and tight.cost.peak_memory_bytes <= limit
    rules = dict(tight.layout_rules)
    assert rules["batch"] == "x"  # data parallel, with every weight class ...
    assert all(rules[f"d_model_stored_{c}"] == "x" for c in CLASSES)  # ... sharded


def test_stored_weight_graphs_round_trip_through_json_at_the_same_cost() -> None:
    cfg = CFG.replace(num_layers=1, shardable_weights=True, activation_dtype="bfloat16")
    model = build_lm(cfg, optimizer="adam")
    loaded = mtf.graph_from_json(mtf.graph_to_json(model.graph, outputs=[model.loss]))
    kinds = {op.op_type for op in loaded.graph.operations}
    assert {"StoredRead", "ReduceScatter"} <= kinds
    a = evaluate(model.graph, MESH, ZERO, HW, outputs=[model.loss])
    b = evaluate(loaded.graph, MESH, ZERO, HW, outputs=loaded.outputs)
    assert a.collectives == b.collectives and a.time_s == b.time_s
    assert "reducescatter" in {c.kind for c in a.collectives}


@pytest.mark.tf
def test_mtf_train_takes_the_dtypes_and_stored_weights(devices, tmp_path, capsys):
    from mtf_core.train import cli

    common = [
        "--layers", "1", "--d_model", "16", "--heads", "4", "--d_kv", "4",
        "--d_ff", "32", "--length", "8", "--batch", "8", "--vocab", "32",
        "--corpus_bytes", "20000", "--no_progress", "--no_eval", "--steps", "2",
        "--mesh", "x:2", "--checkpoint_dir", str(tmp_path / "ckpt"),
    ]  # fmt: skip
    layout = "batch:x;" + ";".join(f"d_model_stored_{c}:x" for c in CLASSES)
    argv = [*common, "--activation_dtype", "bfloat16", "--shardable_weights"]
    assert cli.main([*argv, "--layout", layout]) == 0
    capsys.readouterr()
    slots = "batch:x;" + ";".join(f"d_model_slots_{c}:x" for c in CLASSES)
    argv = [*common, "--activation_dtype", "bfloat16", "--shardable_slots"]
    assert (
        cli.main([*argv, "--layout", slots, "--checkpoint_dir", str(tmp_path / "s")])
        == 0
    )
    capsys.readouterr()
    assert cli.main([*common, "--activation_dtype", "int8", "--layout", "batch:x"]) == 2
    assert "'int8'" in capsys.readouterr().err

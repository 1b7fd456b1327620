"""Per-device memory: live sets and peaks checked against hand-computed bytes."""

from __future__ import annotations

import pytest
from test_cost_graphs import BUILDERS

import mtf_core as mtf
from cost_models import describe_overflow, evaluate, get_hardware, memory_model
from cost_models.memory import ACTIVATION, PARAM, SLOT
from mtf_core.comm import LayoutContext
from mtf_core.liveness import step_operations
from mtf_core.ops.variables import Variable
from mtf_core.optimize import AdamWeightDecayOptimizer


def small_graph():
    """w[k:4,h:8] (128 B), x[b:2,k:4] (32 B), y = x@w [b:2,h:8] (64 B),
    z = relu(y) (64 B), s = sum(z) (4 B)."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    w = mtf.get_variable(m, "w", "k:4,h:8")
    x = mtf.zeros(m, "b:2,k:4")
    y = mtf.einsum([x, w], output_shape="b:2,h:8")
    z = mtf.relu(y)
    s = mtf.reduce_sum(z)
    return g, (w, x, y, z, s)


def names(model, live_set) -> set[str]:
    return {model.tensors[i].name.split(":")[0] for i in live_set}


def test_live_sets_of_a_chain_are_the_three_overlapping_pairs_plus_the_variable():
    g, _ = small_graph()
    mm = memory_model(g)
    assert [(t.kind, t.bytes) for t in mm.tensors] == [
        (PARAM, 128),
        (ACTIVATION, 32),
        (ACTIVATION, 64),
        (ACTIVATION, 64),
        (ACTIVATION, 4),
    ]
    assert [names(mm, s) for s in mm.live_sets] == [
        {"w", "zeros", "einsum"},
        {"w", "einsum", "relu"},
        {"w", "relu", "reduce_sum"},
    ]
    one = LayoutContext.make("m:1", "")
    assert mm.live_set_bytes(one) == [224, 256, 196]
    assert mm.peak_bytes_per_device(one) == 256


@pytest.mark.parametrize(
    "rules, per_set, peak",
    [
        # h split: w 64, x 32, y 32, z 32, s 4
        ("h:m", [128, 128, 100], 128),
        # b split: w 128, x 16, y 32, z 32, s 4
        ("b:m", [176, 192, 164], 192),
        # k split: w 64, x 16, y 64, z 64, s 4
        ("k:m", [144, 192, 132], 192),
    ],
)
def test_slice_bytes_per_live_set_follow_the_layout(rules, per_set, peak):
    g, _ = small_graph()
    mm = memory_model(g)
    ctx = LayoutContext.make("m:2", rules)
    assert mm.live_set_bytes(ctx) == per_set
    assert mm.peak_bytes_per_device(ctx) == peak


def test_evaluate_adds_the_largest_collective_buffer_to_the_peak():
    g, (w, x, y, z, s) = small_graph()
    cost = evaluate(g, "m:2", "k:m", "cpu-host", outputs=[s])
    # relu forces y's allreduce over m: a 64 B result buffer on top of 192 B.
    assert [(c.kind, c.bytes_per_device) for c in cost.collectives] == [
        ("allreduce", 64)
    ]
    assert cost.collective_buffer_bytes == 64
    assert cost.peak_memory_bytes == 192 + 64
    assert cost.param_bytes_per_device == 64
    assert cost.slot_bytes_per_device == 0
    assert cost.activation_peak_bytes == 128
    assert cost.fits
    tight = get_hardware("cpu-host").with_memory(255)
    assert not evaluate(g, "m:2", "k:m", tight, outputs=[s]).fits


def test_allconcat_buffer_is_the_gathered_size():
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "a:8,b:4")
    y = mtf.reshape(x, "ab:32")  # a split: gathered whole first
    cost = evaluate(g, "m:4", "a:m", "cpu-host", outputs=[y])
    assert [(c.kind, c.bytes_per_device) for c in cost.collectives] == [
        ("allconcat", 2 * 4 * 4)
    ]
    assert cost.collective_buffer_bytes == 4 * 2 * 4 * 4


def test_exported_outputs_live_to_the_end_and_identity_shares_its_input_buffer():
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    a = mtf.zeros(m, "n:10")  # 40 B
    b = mtf.identity(a)
    c = mtf.exp(mtf.zeros(m, "n:20"))  # 80 B, after two more ops
    mm = memory_model(g, outputs=[b, c])
    assert len(mm.tensors) == 3  # the identity adds no buffer
    one = LayoutContext.make("m:1", "")
    # a is exported through its identity: alive while c is made.
    assert mm.peak_bytes_per_device(one) == 40 + 80 + 80
    assert memory_model(g).peak_bytes_per_device(one) == 80 + 80
    # A step exporting b alone does not make c (nothing it needs reads it).
    alone = memory_model(g, outputs=[b])
    assert [t.name for t in alone.tensors] == [a.name]
    assert alone.peak_bytes_per_device(one) == 40


def test_optimizer_slots_are_slots_and_live_the_whole_step():
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    w = mtf.get_variable(m, "w", "d:4,f:8")
    loss = mtf.reduce_sum(mtf.square(w))
    (dw,) = mtf.gradients([loss], [w])
    AdamWeightDecayOptimizer(0.1).apply_grads([dw], [w])
    mm = memory_model(g)
    kinds = {t.name.split(":")[0]: t.kind for t in mm.tensors if t.kind != ACTIVATION}
    assert kinds == {
        "w": PARAM,
        "global_step": SLOT,
        "w/adam_m": SLOT,
        "w/adam_v": SLOT,
    }
    persistent = {i for i, t in enumerate(mm.tensors) if t.kind != ACTIVATION}
    assert all(persistent <= s for s in mm.live_sets)
    ctx = LayoutContext.make("x:4", "f:x")
    assert mm.bytes_per_device_by_kind(ctx)[PARAM] == 128 // 4
    assert mm.bytes_per_device_by_kind(ctx)[SLOT] == 2 * 128 // 4 + 4


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_live_sets_are_exactly_the_maximal_per_op_live_sets(name):
    case = BUILDERS[name]()
    mm = memory_model(case.graph, case.outputs)
    # Brute force: the live set while each op of the step runs (every
    # variable is held), then drop dominated ones.
    runs = set(step_operations(case.graph, case.outputs))
    ops = [op for op in case.graph.operations if op in runs or isinstance(op, Variable)]
    index = {t.name: i for i, t in enumerate(mm.tensors)}
    alias = {}
    for op in ops:
        if op.op_type == "Identity":
            alias[op.outputs[0]] = alias.get(op.inputs[0], op.inputs[0])
    root = {t: alias.get(t, t) for op in ops for t in op.outputs}
    first, last = {}, {}
    for k, op in enumerate(ops):
        for t in op.outputs:
            first.setdefault(root[t], k)
            last[root[t]] = max(last.get(root[t], k), k)
        for t in op.inputs:
            last[root[t]] = max(last[root[t]], k)
    for t in case.outputs:
        last[root[t]] = len(ops) - 1
    persistent = {i for i, t in enumerate(mm.tensors) if t.kind != ACTIVATION}
    per_op = []
    for k in range(len(ops)):
        live = set(persistent)
        for t, f in first.items():
            if f <= k <= last[t] and t.name in index:
                i = index[t.name]
                if mm.tensors[i].kind == ACTIVATION:
                    live.add(i)
        per_op.append(frozenset(live))
    maximal = {s for s in per_op if not any(s < o for o in per_op)}
    assert set(mm.live_sets) == maximal
    assert len(mm.live_sets) == len(maximal)


def test_overflow_is_described_by_bytes_over_and_the_biggest_tensors():
    g, _ = small_graph()
    text = describe_overflow(memory_model(g), LayoutContext.make("m:1", ""), 200)
    assert "256 B per device of 200 B (56 B over)" in text
    assert text.index("w:0") < text.index("einsum:0")


def test_bytes_beyond_int64_are_summed_exactly() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    big = mtf.zeros(m, "a:4294967296,b:4294967296")  # 2**66 bytes of float32
    s = mtf.reduce_sum(mtf.exp(big))
    mm = memory_model(g, [s])
    one = LayoutContext.make("x:1", "")
    assert mm.peak_bytes_per_device(one) == 2 * 2**66  # big and exp(big)
    split = LayoutContext.make("x:2", "a:x")
    assert mm.live_set_bytes(split) == [2**66, 2**65 + 4]
    assert mm.bytes_per_device_by_kind(split)["activation"] == 2**66 + 4


def test_live_set_deltas_rebuild_the_live_sets_of_a_training_step() -> None:
    case = BUILDERS["mlp_adam"]()
    mm = memory_model(case.graph, case.outputs)
    for k, (entering, leaving) in enumerate(mm.live_set_deltas):
        members = set(mm.members(k))
        before = set(mm.members(k - 1)) if k else set()
        assert set(entering) == members - before
        assert set(leaving) == before - members
        assert list(entering) == sorted(entering, key=lambda i: (mm.start[i], i))
        assert list(leaving) == sorted(leaving, key=lambda i: (mm.end[i], i))

"""``while_loop`` and decoding (``greedy_decode``, ``beam_search``): values
equal one device's and NumPy references under the 1-D, 2-D and replicated
layouts, one iteration's collectives as ``communication()`` says, eager and
compiled alike, and bad loops refused with clear errors."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from layout_cases import (
    LAYOUTS,
    ONE_DEVICE,
    LayoutCase,
    assert_same_under_layouts,
    collective_specs,
    lower,
)

import mtf_core as mtf
from mtf_core.beam_search import beam_search, greedy_decode

pytestmark = pytest.mark.tf

D = mtf.Dimension
HIDDEN = D("hidden", 8)


def _counting_loop(steps: int = 3):
    """x <- x * w + sum(x), ``steps`` times; ``sum`` over a split hidden dim
    is an allreduce."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    xv = np.arange(32, dtype=np.float32).reshape(4, 8) / 8
    x = mtf.import_tf_tensor(mesh, xv, "batch:4,hidden:8")
    w = mtf.import_tf_tensor(mesh, np.full(8, 0.5, np.float32), "hidden:8")
    limit = mtf.constant(mesh, steps, (), "int32")

    def cond(i, x):
        return mtf.less(i, limit)

    def body(i, x):
        return [i + 1, x * w + mtf.reduce_sum(x, reduced_dim=HIDDEN)]

    i, y = mtf.while_loop(cond, body, [mtf.constant(mesh, 0, (), "int32"), x])
    want = xv
    for _ in range(steps):
        want = want * 0.5 + want.sum(1, keepdims=True)
    return graph, mesh, i, y, want


def test_while_loop_values_do_not_depend_on_layout(devices: list[str]) -> None:
    graph, mesh, i, y, want = _counting_loop()
    got_i, got_y = assert_same_under_layouts(graph, mesh, devices, [i, y])
    assert got_i == 3
    np.testing.assert_allclose(got_y, want, rtol=1e-6)
    assert y.operation.op_type == "WhileLoop"
    # the sub-graphs are the loop's own, not the graph's
    assert not any(op.op_type == "LoopInput" for op in graph.operations)
    assert y.operation.flops() == sum(
        op.flops() for op in y.operation.body_operations + y.operation.cond_operations
    )


@pytest.mark.parametrize("case", LAYOUTS, ids=[c.name for c in LAYOUTS])
def test_while_loop_records_one_iterations_collectives_eager_and_compiled(
    devices: list[str], case: LayoutCase
) -> None:
    graph, mesh, _, y, want = _counting_loop()
    impl = case.impl(devices)
    spec = Counter(collective_specs(y.operation.communication(impl.ctx)))
    _, low = lower(graph, mesh, case, devices, [y])
    assert Counter(collective_specs(low.counters.collectives)) == spec
    step = mtf.compile_function(graph, {mesh: impl}, inputs=[], outputs=[y])
    np.testing.assert_allclose(step()[0], want, rtol=1e-6)
    assert Counter(collective_specs(step.counters.collectives)) == spec
    hidden_split = "hidden" in case.rules
    # [batch:4] float32 sums: 16 bytes, 8 when batch is split in two too
    if hidden_split:
        n = 8 if case.rules.startswith("batch") else 16
        assert spec == Counter({("allreduce", ("model",), n): 1})
    else:
        assert spec == Counter()


def test_while_loop_accumulators_sum_over_iterations(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, np.ones(8, np.float32), "hidden:8")
    limit = mtf.constant(mesh, 4, (), "int32")
    i, acc = mtf.while_loop(
        lambda i: mtf.less(i, limit),
        lambda i: [i + 1, x * mtf.cast(i, "float32")],
        [mtf.constant(mesh, 0, (), "int32")],
        has_accumulators=True,
    )
    (got,) = assert_same_under_layouts(graph, mesh, devices, [acc])
    np.testing.assert_allclose(got, np.full(8, 0 + 1 + 2 + 3))


def test_while_loop_body_draws_new_random_numbers_each_iteration(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    limit = mtf.constant(mesh, 2, (), "int32")
    zeros = mtf.zeros(mesh, "k:2,hidden:8")
    pos = mtf.range(mesh, D("k", 2), "int32")

    def body(i, kept):
        u = mtf.random_uniform(mesh, "hidden:8")
        here = mtf.cast(mtf.equal(pos, i), "float32")
        return [i + 1, kept + here * u]

    _, kept = mtf.while_loop(
        lambda i, k: mtf.less(i, limit),
        body,
        [mtf.constant(mesh, 0, (), "int32"), zeros],
    )
    (got,) = assert_same_under_layouts(graph, mesh, devices, [kept])
    assert (got > 0).all() and not np.allclose(got[0], got[1])


def test_while_loop_refuses_bad_functions() -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, "hidden:8")
    t = mtf.constant(mesh, True, (), "bool")
    with pytest.raises(mtf.ShapeError, match="cond_fn must return a scalar"):
        mtf.while_loop(lambda x: mtf.less(x, 1.0), lambda x: [x], [x])
    with pytest.raises(ValueError, match="cond_fn returned float32; expected a bool"):
        mtf.while_loop(lambda x: mtf.reduce_sum(x), lambda x: [x], [x])
    with pytest.raises(ValueError, match="returned 2 tensors for 1 loop variables"):
        mtf.while_loop(lambda x: t, lambda x: [x, x], [x])
    with pytest.raises(mtf.ShapeError, match="loop variable 0 is \\[hidden:8\\]"):
        mtf.while_loop(lambda x: t, lambda x: [mtf.reduce_sum(x)], [x])


# --------------------------------------------------------------------------
# decoding
# --------------------------------------------------------------------------

V, L, B, K = 8, 4, 4, 2
BATCH, BEAM, LENGTH, VOCAB = D("batch", B), D("beam", K), D("length", L), D("hidden", V)
# vocab is named "hidden" so the model and 2-D layouts split it


def _bigram(rng_seed: int = 0) -> np.ndarray:
    w = np.random.RandomState(rng_seed).randn(V, V).astype(np.float32) * 3
    w[:, 1] = -30.0  # EOS (id 1) never wins unless a test says so
    return w


def _bigram_logits(table: mtf.Tensor, ids: mtf.Tensor, step: mtf.Tensor, back: int):
    """``table[ids[step - back]]``, with id 0 before the start."""
    prev = mtf.gather(ids, step - back, LENGTH)  # out of range -> 0
    return mtf.gather(table, prev, D("prev", V))


def test_greedy_decode_follows_argmax_of_a_bigram_model(devices: list[str]) -> None:
    w = _bigram()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    table = mtf.import_tf_tensor(mesh, w, mtf.Shape([D("prev", V), VOCAB]))
    first = np.array([2, 3, 4, 5], np.int32)
    forced = mtf.import_tf_tensor(
        mesh, np.stack([first, *[np.zeros(B, np.int32)] * (L - 1)], 1), [BATCH, LENGTH]
    )

    def logits_fn(step, ids, states):
        return _bigram_logits(table, ids, step, 1), states

    ids = greedy_decode(
        logits_fn, mtf.zeros(mesh, [BATCH, LENGTH], dtype="int32"), forced_ids=forced
    )
    (got,) = assert_same_under_layouts(graph, mesh, devices, [ids])
    want = np.zeros((B, L), np.int32)
    want[:, 0] = first
    for p in range(1, L):
        want[:, p] = w[want[:, p - 1]].argmax(1)
    np.testing.assert_array_equal(got, want)


def _brute_force_top(lp_fn, k: int) -> list[tuple[float, tuple[int, ...]]]:
    cands = [
        (sum(lp_fn(s, p) for p in range(L)), s)
        for s in itertools.product(range(V), repeat=L)
    ]
    return sorted(cands, reverse=True)[:k]


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_beam_search_finds_the_best_sequences_of_a_position_model(
    devices: list[str],
) -> None:
    rng = np.random.RandomState(1)
    tables = rng.randn(B, L, V).astype(np.float32) * 2
    tables[:, :, 1] = -30.0
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    tab = mtf.import_tf_tensor(mesh, tables, [BATCH, LENGTH, VOCAB])

    def logits_fn(step, ids, states):
        logits = mtf.gather(tab, step, LENGTH)
        return mtf.broadcast(logits, [BATCH, BEAM, VOCAB]), states

    seqs, scores = beam_search(
        logits_fn, mtf.zeros(mesh, [BATCH, BEAM, LENGTH], dtype="int32"), alpha=0.0
    )
    got_seqs, got_scores = assert_same_under_layouts(
        graph, mesh, devices, [seqs, scores]
    )
    for b in range(B):
        lp = _log_softmax(tables[b])
        top = _brute_force_top(lambda s, p, lp=lp: lp[p, s[p]], K)
        assert [tuple(s) for s in got_seqs[b]] == [s for _, s in top]
        np.testing.assert_allclose(got_scores[b], [v for v, _ in top], rtol=1e-5)


def test_beam_search_states_follow_their_beams(devices: list[str]) -> None:
    """A model that reads the token two steps back from a state it carries
    decodes exactly as one that reads it from the ids."""
    w = _bigram(2)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    table = mtf.import_tf_tensor(mesh, w, mtf.Shape([D("prev", V), VOCAB]))
    ids0 = mtf.zeros(mesh, [BATCH, BEAM, LENGTH], dtype="int32")

    def from_ids(step, ids, states):
        return _bigram_logits(table, ids, step, 2), states

    def from_state(step, ids, states):
        # the state holds the ids this function saw one step earlier
        (seen,) = states
        logits = _bigram_logits(table, mtf.cast(seen, "int32"), step, 2)
        return logits, [mtf.cast(ids, "float32")]

    state0 = mtf.zeros(mesh, [BATCH, BEAM, LENGTH])
    by_ids = beam_search(from_ids, ids0, alpha=0.6)
    by_state = beam_search(from_state, ids0, alpha=0.6, states=[state0])
    cases = [ONE_DEVICE, LAYOUTS[1], LAYOUTS[3]]
    got = assert_same_under_layouts(
        graph, mesh, devices, [*by_ids, *by_state], layouts=cases
    )
    np.testing.assert_array_equal(got[0], got[2])
    np.testing.assert_allclose(got[1], got[3], rtol=1e-6)
    # and the result is a real search: the best beam is at least as good as
    # greedy under the same length-penalized score
    assert (got[1][:, 0] >= got[1][:, 1]).all()


def test_beam_search_returns_finished_sequences_once_eos_wins(
    devices: list[str],
) -> None:
    tables = np.zeros((L, V), np.float32)
    tables[0, 3] = 5.0  # first token 3, then EOS (1) at once
    tables[1, 1] = 10.0
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    tab = mtf.import_tf_tensor(mesh, tables, [LENGTH, VOCAB])

    def logits_fn(step, ids, states):
        logits = mtf.gather(tab, step, LENGTH)
        return mtf.broadcast(logits, [BATCH, BEAM, VOCAB]), states

    seqs, scores = beam_search(
        logits_fn, mtf.zeros(mesh, [BATCH, BEAM, LENGTH], dtype="int32"), alpha=0.6
    )
    got_seqs, got_scores = assert_same_under_layouts(
        graph, mesh, devices, [seqs, scores]
    )
    np.testing.assert_array_equal(got_seqs[:, 0], np.tile([3, 1, 0, 0], (B, 1)))
    lp0 = _log_softmax(tables[0])[3]
    lp1 = _log_softmax(tables[1])[1]
    # a finished score: log prob over the penalty at its length (2)
    np.testing.assert_allclose(
        got_scores[:, 0], (lp0 + lp1) / ((5 + 2) / 6) ** 0.6, rtol=1e-5
    )


def test_a_graph_with_a_while_loop_writes_but_refuses_to_load_clearly() -> None:
    graph, mesh, _, y, _ = _counting_loop()
    text = mtf.graph_to_json(graph)
    assert '"WhileLoop"' in text and "LoopInput" not in text
    with pytest.raises(mtf.SerializationError, match="condition and body are Python"):
        mtf.graph_from_json(text)


def test_while_loop_on_the_spmd_backend_eager_and_compiled(devices: list[str]) -> None:
    graph, mesh, _, y, want = _counting_loop()
    impl = mtf.SimdMeshImpl("model:4", "hidden:model", devices[:4])
    low = mtf.Lowering(graph, {mesh: impl})
    np.testing.assert_allclose(low.export_to_tf_tensor(y).numpy(), want, rtol=1e-6)
    step = mtf.compile_function(graph, {mesh: impl}, inputs=[], outputs=[y])
    np.testing.assert_allclose(step()[0], want, rtol=1e-6)
    spec = Counter(collective_specs(y.operation.communication(impl.ctx)))
    assert Counter(collective_specs(step.counters.collectives)) == spec
    assert spec == Counter({("allreduce", ("model",), 16): 1})

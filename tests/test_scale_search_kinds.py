"""The scale search gives one answer however it runs, on the model kinds
beyond the dense LM of tests/test_scale_search.py: an encoder-decoder and a
mixture of experts, each under a memory limit that binds.

In one process, on two forked processes and exhaustively (every trial on
its full stage graph), the plan and the trials are the same.
``bench/scale_agreement.py`` runs the same comparison on random models
(docs/benchmarks.md, "Scale search: one answer however it runs"); these two
cases pin it for the kinds that bench draws beside dense models.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_scale_search import _in_fresh_interpreter, _same_plan

from layout_planner.choices import plan_transformer
from mtf_core.models import TransformerConfig

ENCODER_DECODER = TransformerConfig(
    num_layers=6, d_model=128, heads=4, d_kv=32, d_ff=256, vocab=256,
    length=16, batch=8, activation="gelu",
)  # fmt: skip
MOE = TransformerConfig(
    num_layers=6, d_model=256, heads=4, d_kv=16, d_ff=128, vocab=1000,
    length=64, batch=64, experts=4,
)  # fmt: skip

#: (config, encoder-decoder, devices, hardware, memory limit).
CASES = {
    # 6 + 6 layers on one stage (priced from stacks); the limit leaves no
    # free layout fitting on 2 of the 3 meshes, whose joint programs then
    # recompute whole blocks.
    "encoder-decoder": (ENCODER_DECODER, True, 4, "h100-nvlink-ib", 33 * 2**20),
    # 1 and 2 stages; the limit rules out every single-stage mesh.
    "moe": (MOE, False, 8, "a100-nvlink-ib", 26 * 2**20),
}

_PLAN = """
import json
from layout_planner.choices import plan_transformer
from mtf_core.models import TransformerConfig
cfg = TransformerConfig(**json.loads(CFG))
plan = plan_transformer(cfg, DEVICES, HW, encoder_decoder=ED, memory_limit=LIMIT,
                        time_limit_s=30.0, workers=WORKERS)
print(json.dumps([str(plan.choice), plan.layout_rules, plan.step_time_s,
                  plan.peak_memory_bytes,
                  [(str(t.choice), t.step_time_s, t.peak_memory_bytes, t.fits,
                    t.layout_rules) for t in plan.trials]]))
"""


def _plan_out(plan):
    return [
        str(plan.choice),
        plan.layout_rules,
        plan.step_time_s,
        plan.peak_memory_bytes,
        [
            [str(t.choice), t.step_time_s, t.peak_memory_bytes, t.fits, t.layout_rules]
            for t in plan.trials
        ],
    ]


@pytest.mark.parametrize("kind", sorted(CASES))
def test_one_process_two_processes_and_exhaustive_give_one_plan(kind):
    cfg, ed, devices, hw, limit = CASES[kind]
    kw = dict(encoder_decoder=ed, memory_limit=limit, time_limit_s=30.0)
    one = plan_transformer(cfg, devices, hw, workers=1, **kw)
    # Forking needs a process whose TensorFlow has not run, and a test
    # worker may have run it: the two processes plan in a fresh interpreter.
    code = (
        f"CFG = {json.dumps(json.dumps(dataclasses.asdict(cfg)))}\n"
        f"DEVICES, HW, ED, LIMIT, WORKERS = {devices}, {hw!r}, {ed}, {limit}, 2\n"
        + _PLAN
    )
    two = _in_fresh_interpreter(code, timeout=600)
    assert two == _plan_out(one)  # plan and every trial, to the last bit
    _same_plan(
        one, plan_transformer(cfg, devices, hw, workers=1, exhaustive=True, **kw)
    )

    # The limit binds: some meshes do not fit without recomputation, or at
    # all, and the trials go past the first pass.
    assert any(not t.fits for t in one.trials)
    assert one.peak_memory_bytes <= limit
    stages = {t.choice.stages for t in one.trials}
    if kind == "encoder-decoder":
        assert stages == {1}
        assert one.choice.recompute_attention == "block"
        assert sum(t.choice.recompute_attention == "block" for t in one.trials) == 2
    else:
        assert stages == {1, 2} and one.choice.stages == 2
        assert not any(t.fits for t in one.trials if t.choice.stages == 1)
    # Fewer, larger micro-batches were tried on the winner's mesh.
    mesh = one.choice.mesh_sizes
    tried = {t.choice.micro_batches for t in one.trials if t.choice.mesh_sizes == mesh}
    assert len(tried) >= 3
    # And the plan is the fastest trial that fits (its step from the full
    # stage graph's evaluation, the trials' from the representatives).
    fastest = min((t for t in one.trials if t.fits), key=lambda t: t.step_time_s)
    assert fastest.choice == one.choice
    assert one.step_time_s == pytest.approx(fastest.step_time_s, rel=1e-9)

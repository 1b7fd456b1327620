"""The scale planner's sequence axis: ``plan_transformer(sequence=...)``.

A mesh ``pp x dp x sp x tp`` gives the stage layout a third axis; a
micro-batch is still one sequence per data-parallel replica.  Meshes without
one are written as before, the search over both is the fastest fitting
trial of all, and bad sizes are refused by name.  (Lowered on 8 logical CPUs:
``tests/test_scale_plan_lowering.py``, case ``pp2-sequence``; over HTTP:
``tests/test_api_scale_plans.py``.)
"""

from __future__ import annotations

import pytest

from layout_planner.choices import (
    ScaleChoice,
    ScaleError,
    plan_transformer,
    price_layout,
)
from mtf_core.models import TransformerConfig

pytestmark = pytest.mark.solver

CFG = TransformerConfig(
    num_layers=4, d_model=16, heads=4, d_kv=4, d_ff=32, vocab=32, length=8, batch=8
)  # fmt: skip
HW = "h100-nvlink-ib"


def test_a_mesh_without_a_sequence_axis_is_written_as_before() -> None:
    plain = ScaleChoice(2, 8, 4, 16, "1f1b", "none", "none")
    assert plain.sequence == 1 and plain.devices == 64
    assert (plain.stage_mesh, plain.full_mesh) == ("dp:8;tp:4", "pp:2;dp:8;tp:4")
    assert str(plain).startswith("pp=2 dp=8 tp=4 micro_batches=16")
    sp = ScaleChoice(2, 4, 2, 16, "1f1b", "none", "none", sequence=2)
    assert sp.devices == 32 and sp.mesh_sizes == (2, 4, 2, 2)
    assert (sp.stage_mesh, sp.full_mesh) == ("dp:4;sp:2;tp:2", "pp:2;dp:4;sp:2;tp:2")
    assert str(sp).startswith("pp=2 dp=4 sp=2 tp=2 micro_batches=16")


def test_the_search_over_a_sequence_axis_takes_the_fastest_fitting_trial() -> None:
    plan = plan_transformer(
        CFG,
        8,
        HW,
        stages=[2],
        tensor=[2],
        sequence=[1, 2],
        memory_limit=60_000,
        recompute=[("none", "none")],
        workers=1,
    )
    meshes = {t.choice.mesh_sizes for t in plan.trials}
    assert meshes == {(2, 2, 1, 2), (2, 1, 2, 2)}
    # One sequence per data-parallel replica: 4 micro-batches of 2 on dp 2,
    # 8 of 1 on dp 1 (then fewer, larger ones on the best mesh).
    first = {t.choice.mesh_sizes: t.choice.micro_batches for t in plan.trials[:2]}
    assert first == {(2, 2, 1, 2): 4, (2, 1, 2, 2): 8}
    fitting = [t for t in plan.trials if t.fits and t.step_time_s is not None]
    fastest = min(fitting, key=lambda t: t.step_time_s or 0.0)
    assert plan.choice == fastest.choice
    assert plan.step_time_s == pytest.approx(fastest.step_time_s, rel=1e-9)
    # Each trial's rules use only its own stage axes.
    for t in fitting:
        axes = set(dict(p.split(":") for p in t.layout_rules.split(";") if p).values())
        allowed = {"dp", "tp"} | ({"sp"} if t.choice.sequence > 1 else set())
        assert axes <= allowed, t
    if plan.choice.sequence > 1:
        assert "sp=2" in plan.explain() and "sp:2" in plan.explain()


def test_a_sequence_mesh_prices_like_the_plan_that_chose_it() -> None:
    plan = plan_transformer(
        CFG,
        8,
        HW,
        stages=[2],
        tensor=[2],
        sequence=[2],
        micro_batches=8,
        memory_limit=60_000,
        recompute=[("none", "none")],
        workers=1,
    )
    assert plan.choice.full_mesh == "pp:2;dp:1;sp:2;tp:2"
    assert plan.devices == 8
    priced = price_layout(CFG, plan.choice, plan.layout_rules, plan.hardware)
    assert priced.step_time_s == pytest.approx(plan.step_time_s, rel=1e-9)
    assert priced.peak_memory_bytes == plan.peak_memory_bytes


@pytest.mark.parametrize(
    ("sequence", "named"),
    [
        ((3,), "sequence axis size 3 does not divide the length 8"),
        ((1, 8), "sequence axis size 8 does not divide 4 devices"),
        ((0,), "sequence axis size 0"),
        ((True,), "sequence axis size True"),
        ((), "sequence is empty"),
    ],
)
def test_bad_sequence_sizes_are_refused_naming_the_value(sequence, named) -> None:
    with pytest.raises(ScaleError, match=named):
        plan_transformer(CFG, 4, HW, sequence=sequence, workers=1)


def test_a_priced_choice_on_a_sequence_axis_must_divide_the_length() -> None:
    bad = ScaleChoice(1, 1, 1, 8, "1f1b", "none", "none", sequence=3)
    with pytest.raises(ScaleError, match="sequence axis size 3"):
        price_layout(CFG, bad, "", HW)


def test_the_search_equals_the_best_of_every_mesh_planned_alone() -> None:
    """Exhaustive check: with and without a sequence axis, the search's step
    is the fastest of every mesh planned on its own (the bounds skip none
    that could win)."""
    kw = {
        "micro_batches": 4,
        "memory_limit": 60_000,
        "recompute": [("none", "none")],
        "workers": 1,
    }
    plan = plan_transformer(
        CFG, 8, HW, stages=[1, 2], tensor=[1, 2], sequence=[1, 2], **kw
    )
    alone = {}
    for pp in (1, 2):
        for sp in (1, 2):
            for tp in (1, 2):
                if (CFG.batch // 4) % (8 // (pp * sp * tp)):
                    continue  # a micro-batch must split over dp
                try:
                    p = plan_transformer(
                        CFG, 8, HW, stages=[pp], tensor=[tp], sequence=[sp], **kw
                    )
                except ScaleError:
                    continue  # nothing fits on this mesh
                alone[(pp, sp, tp)] = p
    assert len(alone) >= 3 and any(sp == 2 for _, sp, _ in alone)
    best = min(alone.values(), key=lambda p: p.step_time_s)
    assert plan.step_time_s == best.step_time_s
    assert plan.choice == best.choice

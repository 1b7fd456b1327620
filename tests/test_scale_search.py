"""The scale planner's search on representative stage graphs
(layout_planner.scale_search) returns the exhaustive search's plan, and prices
every trial as the full stage graph does."""

from __future__ import annotations

import copy
import itertools
import random
import sys
from typing import Any

import pytest

from cost_models.pipeline import PipelineSpec
from cost_models.profiles import get_hardware
from layout_planner.choices import ScaleChoice, plan_transformer
from layout_planner.program import Objective, SolveParams
from layout_planner.scale_search import _trial
from layout_planner.scale_stages import (
    DerivedGraph,
    Stage,
    StageGraph,
    Stages,
    held_resized,
    price_step,
)
from layout_planner.stacked import LayerStack
from mtf_core.models import TransformerConfig, build_encoder_decoder, build_lm
from mtf_core.shapes import convert_to_shape

CFG = TransformerConfig(
    num_layers=12, d_model=256, heads=8, d_kv=32, d_ff=1024, vocab=1024,
    length=128, batch=32, activation_dtype="bfloat16",
)  # fmt: skip


def _same_plan(fast, slow):
    assert fast.choice == slow.choice
    assert fast.layout_rules == slow.layout_rules
    assert fast.step_time_s == pytest.approx(slow.step_time_s, rel=1e-9)
    assert fast.peak_memory_bytes == slow.peak_memory_bytes
    assert fast.pipeline.held_bytes == slow.pipeline.held_bytes
    assert [t.choice for t in fast.trials] == [t.choice for t in slow.trials]
    ties = 0
    for a, b in zip(fast.trials, slow.trials):
        assert a.fits == b.fits
        if b.step_time_s is None:  # nothing fits: the same reason
            assert a.step_time_s is None and a.note == b.note
            continue
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
        assert a.peak_memory_bytes == b.peak_memory_bytes
        # Layouts of equal step and peak may be told apart by a last
        # picosecond of float summation order: another layout of the tie.
        ties += a.layout_rules != b.layout_rules
    assert ties <= 1


def _in_fresh_interpreter(code: str, timeout: float = 300) -> dict:
    """The JSON that ``code`` prints last, run in a fresh interpreter:
    forking workers needs a process whose TensorFlow has not run, and a
    test worker may have run it."""
    import json
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize("memory_mib", [None, 30])
def test_search_on_representatives_returns_the_exhaustive_plan(memory_mib):
    # 8 devices: pipelines of 1, 2, 4 stages (12, 6, 3 layers: the first two
    # priced from 2-4 layer graphs), tensor axes 1-8; 30 MiB makes the search
    # go through recomputation options (meshes whose layout without
    # recomputation does not fit, then the program that chooses it).
    limit = None if memory_mib is None else memory_mib * 2**20
    kw = dict(hardware="h100-nvlink-ib", memory_limit=limit, time_limit_s=30.0)
    fast = plan_transformer(CFG, 8, **kw)
    slow = plan_transformer(CFG, 8, exhaustive=True, **kw)
    _same_plan(fast, slow)
    assert len(fast.trials) >= 8
    if limit is not None:
        assert fast.choice.recompute_attention == "block"
        assert sum(not t.fits for t in fast.trials) >= 3
        assert any(t.choice.recompute_attention != "none" for t in fast.trials)
    # The winner was verified on its full stage graph.
    assert fast.stage_plan.evaluation is not None
    assert fast.stage_plan.evaluation.peak_memory_bytes <= fast.peak_memory_bytes


#: (recomputation, experts, builder) of the stacking tests.
STACKED_CASES = [
    (("none", "none"), 0, build_lm),
    (("block", "block"), 0, build_lm),
    (("scores", "none"), 4, build_lm),
    # Its decoder layers read the encoder output each through an identity
    # of their own, so its layers stack too.
    (("scores", "block"), 0, build_encoder_decoder),
]


def _stacking_stages(experts: int, builder: Any) -> Stages:
    """One search's stages of CFG (weights stored shardable) with ``experts``."""
    cfg = CFG.replace(shardable_weights=True, shardable_slots=True, experts=experts)
    return Stages(cfg, builder, "adam")


@pytest.mark.parametrize("recompute,experts,builder", STACKED_CASES)
def test_representative_prices_layouts_as_the_full_stage_graph(
    recompute, experts, builder
):
    hw = get_hardware("h100-nvlink-ib")
    stages = _stacking_stages(experts, builder)
    # Three meshes priced by one search's stages, so units priced on one mesh
    # are reused on the others (the shared unit costs): each must still price
    # as its own full stage graph does.  6 layers a stage.
    for pp, dp, tp, m in ((2, 4, 2, 8), (2, 4, 4, 8), (2, 2, 2, 16)):
        choice = ScaleChoice(pp, dp, tp, m, "1f1b", *recompute)
        rep = stages.stage(choice, hw)
        assert rep.problem is not None and len(rep.graphs) == 2  # 2 and 3 layers
        mesh = convert_to_shape(choice.stage_mesh)
        full = Stage(mesh, hw, [stages.graph(choice, 6)], 6)
        rng = random.Random(1)
        dims = rep.problem.free_dims
        checked = 0
        for _ in range(20000):
            asg = {d: rng.choice([None, *rep.problem.allowed[d]]) for d in dims}
            if rep.problem.table_cost(asg).invalid is not None:
                continue
            rules = rep.problem.rules_for(asg)
            got = rep.parts(rules)  # the stacked tables (the once part too)
            want, cost = full.evaluated(rules)  # evaluate and split_step
            assert got.time_s == pytest.approx(want.time_s, rel=1e-9)
            assert got.once_s == pytest.approx(want.once_s, rel=1e-9)
            assert got.peak_bytes == want.peak_bytes == cost.peak_memory_bytes
            assert got.held_bytes == want.held_bytes
            # The program's memory rows hold the other micro-batches in
            # flight: its peak is the pipeline's.
            program = rep.problem.program(Objective.TIME, hw.memory_bytes)
            rows = copy.copy(rep.problem)
            rows.rows, rows.row_constants = program.row_bytes, program.row_constants
            k = PipelineSpec(pp, m, "1f1b").in_flight
            assert rows.table_cost(asg).peak_bytes == (
                want.peak_bytes + (k - 1) * want.held_bytes
            )
            checked += 1
            if checked == 8:
                break
        assert checked == 8


@pytest.mark.parametrize("recompute,experts,builder", STACKED_CASES)
def test_a_resized_stage_derives_what_its_unbuilt_three_layer_graph_gives(
    recompute, experts, builder
):
    hw = get_hardware("h100-nvlink-ib")
    stages = _stacking_stages(experts, builder)

    def built(choice, layers):
        config = stages.stage_config(choice, layers)
        return StageGraph(builder(config, optimizer="adam"))

    # 6 layers a stage, micro-batches of 4 (the reference), 2, 8 and 1.
    for m in (8, 16, 4, 32):
        choice = ScaleChoice(2, 1, 2, m, "1f1b", *recompute)
        before = stages.built_layers
        two, three = stages.stage(choice, hw).graphs
        if m == 8:
            assert isinstance(three, StageGraph)  # the reference's own
            continue
        assert isinstance(three, DerivedGraph)  # not built: only the 2-layer graph
        assert stages.built_layers == before + 2
        want = built(choice, 3)
        assert three.held.counts == want.held.counts
        fresh = LayerStack(two.analysis, want.analysis, built(choice, 4).analysis)
        got = stages._stack(choice)
        assert got is not None and got.unit_steps == fresh.unit_steps
        assert (got.row_base == fresh.row_base).all()
        assert (got.row_step == fresh.row_step).all()


@pytest.mark.parametrize("stages_of", [4, 3])  # 3 and 4 layers a stage
def test_a_stage_of_three_or_four_layers_is_priced_from_its_stack(stages_of):
    hw = get_hardware("h100-nvlink-ib")
    stages = _stacking_stages(0, build_lm)
    n = CFG.num_layers // stages_of
    # Another micro-batch size's stage builds the reference stack; this one
    # is resized from it, building its 2-layer graph alone.
    stages.stage(ScaleChoice(2, 1, 2, 8, "1f1b", "none", "none"), hw)
    choice = ScaleChoice(stages_of, 2, 2, 16, "1f1b", "none", "none")
    before = stages.built_layers
    rep = stages.stage(choice, hw)
    assert stages.built_layers == before + 2
    assert len(rep.graphs) == 2 and isinstance(rep.graphs[1], DerivedGraph)
    mesh = convert_to_shape(choice.stage_mesh)
    full = Stage(mesh, hw, [stages.graph(choice, n)], n)
    rng = random.Random(3)
    checked = 0
    assert rep.problem is not None
    for _ in range(20000):
        asg = {
            d: rng.choice([None, *rep.problem.allowed[d]])
            for d in rep.problem.free_dims
        }
        if rep.problem.table_cost(asg).invalid is not None:
            continue
        rules = rep.problem.rules_for(asg)
        got = rep.parts(rules)
        want, cost = full.evaluated(rules)
        assert got.time_s == pytest.approx(want.time_s, rel=1e-9)
        assert got.once_s == pytest.approx(want.once_s, rel=1e-9)
        assert got.peak_bytes == want.peak_bytes == cost.peak_memory_bytes
        assert got.held_bytes == want.held_bytes
        checked += 1
        if checked == 8:
            break
    assert checked == 8


def test_held_buffers_are_not_derived_from_a_stage_holding_other_classes():
    stages = Stages(CFG, build_lm, "adam")
    none = ("none", "none")
    ref = [stages.graph(ScaleChoice(2, 1, 2, 8, "1f1b", *none), k).held for k in (2, 3)]
    half = ScaleChoice(2, 1, 2, 16, "1f1b", *none)
    assert held_resized(*ref, stages.graph(half, 2).held) is not None
    blocks = ScaleChoice(2, 1, 2, 16, "1f1b", "block", "block")
    assert held_resized(*ref, stages.graph(blocks, 2).held) is None


@pytest.mark.parametrize("exhaustive", [False, True])
def test_progress_reports_each_mesh_tried_in_order(exhaustive):
    seen: list[tuple[str, float]] = []
    plan = plan_transformer(
        CFG, 8, hardware="h100-nvlink-ib", exhaustive=exhaustive, workers=1,
        progress=lambda phase, done: seen.append((phase, done)),
    )  # fmt: skip
    meshes = [p for p, _ in seen if p.startswith("mesh ")]
    # One call per mesh the search reached (each mesh has 1-3 trials).
    tried = {(t.choice.stages, t.choice.data, t.choice.tensor) for t in plan.trials}
    assert len(meshes) == len(tried)
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and 0.0 <= fractions[0] < 1.0
    if not exhaustive:
        # The winner's check comes last (after fewer micro-batches were
        # tried on the best mesh, where they won).
        phase, done = seen[-1]
        assert phase.endswith(f"checking {plan.choice} on its full stage graph")
        assert done == 1.0


def test_progress_runs_forward_where_fewer_micro_batches_come_first():
    # On one stage the first pass's best (dp 2, whose free layout fits in
    # 20 MiB) gets its fewer micro-batches before the joint programs of
    # dp 8 and dp 4 (whose do not): reported at 0.8, before theirs.
    seen: list[tuple[str, float]] = []
    small = CFG.replace(num_layers=4, d_model=64, d_ff=128, batch=8)
    plan = plan_transformer(
        small, 8, stages=[1], workers=1, memory_limit=20 * 2**20,
        progress=lambda phase, done: seen.append((phase, done)),
    )  # fmt: skip
    assert plan.fits and plan.choice.stages == 1
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions)
    fewer = [f for p, f in seen if p.startswith("fewer micro-batches")]
    assert fewer and fewer[0] == 0.8


_TWO_PROCESSES = """
import json
from layout_planner.choices import plan_transformer
from mtf_core.models import TransformerConfig
cfg = TransformerConfig(**json.loads(CFG))
seen = []
kw = dict(hardware="h100-nvlink-ib", memory_limit=30 * 2**20, time_limit_s=30.0)
one = plan_transformer(cfg, 8, workers=1, **kw)
two = plan_transformer(cfg, 8, workers=2, progress=lambda p, f: seen.append((p, f)), **kw)
# Wide enough for whole blocks to be left out of joint programs (2 GiB).
wide = cfg.replace(d_model=2048, heads=16, d_kv=128, d_ff=8192, length=1024)
kw["memory_limit"] = 2 * 2**30
wide_one = plan_transformer(wide, 8, workers=1, **kw)
wide_two = plan_transformer(wide, 8, workers=2, **kw)
def out(plan):
    ev = plan.stage_plan.evaluation
    return [str(plan.choice), plan.layout_rules,
            plan.step_time_s, plan.peak_memory_bytes, ev.time_s, ev.peak_memory_bytes,
            [(str(t.choice), t.step_time_s, t.peak_memory_bytes, t.fits, t.layout_rules,
              t.note) for t in plan.trials]]
print(json.dumps({"one": out(one), "two": out(two), "seen": seen,
                  "wide_one": out(wide_one), "wide_two": out(wide_two)}))
"""


def test_two_processes_give_the_same_plan_and_trials():
    import dataclasses
    import json

    code = "CFG = " + repr(json.dumps(dataclasses.asdict(CFG))) + _TWO_PROCESSES
    got = _in_fresh_interpreter(code, timeout=600)
    assert got["one"] == got["two"]  # plan and every trial, to the last bit
    assert got["wide_one"] == got["wide_two"]
    # Joint programs slower than the step before them say so, alike.
    assert any("or less" in t[-1] for t in got["wide_one"][-1])
    meshes = [p for p, _ in got["seen"] if p.startswith("mesh ")]
    assert meshes and all(p.endswith("(on 2 processes)") for p in meshes)
    fractions = [f for _, f in got["seen"]]
    assert fractions == sorted(fractions)


def test_after_tensorflow_the_search_forks_and_beside_its_runtime_watches_its_forks():
    # A program that lowers its plan has TensorFlow loaded and its logical
    # devices configured.  Until its first op TensorFlow runs no thread of
    # its own: a fork is safe.  Once it has run an op its thread pools
    # exist: a fork is not safe unwatched, but the search watches each
    # forked worker for a stall anyway, and forks.  Should one stall (here:
    # a job that sleeps in every forked worker), the search runs again on
    # helpers started as fresh interpreters, and forks no more.  Every
    # trial is the one process's, to the last bit.
    import dataclasses
    import json

    code = (
        "import os\n"
        "os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'\n"
        "import json, time\n"
        "import tensorflow\n"
        "from layout_planner import scale_search, scale_workers\n"
        "from layout_planner.choices import plan_transformer\n"
        "from mtf_core.models import TransformerConfig\n"
        "made = []  # the kind of each Workers made\n"
        "_make = scale_workers.Workers.__init__\n"
        "def _record(self, job, make_state, count, fresh=False, watch=False):\n"
        "    made.append('fresh' if fresh else 'watched' if watch else 'forked')\n"
        "    _make(self, job, make_state, count, fresh, watch)\n"
        "scale_workers.Workers.__init__ = _record\n"
        "helped = []  # the workers' results, as the search takes them\n"
        "_taken = scale_workers.Workers.finished\n"
        "def _count(self, timeout=None):\n"
        "    got = _taken(self, timeout)\n"
        "    helped.extend(got)\n"
        "    return got\n"
        "scale_workers.Workers.finished = _count\n"
        "CFG = " + repr(json.dumps(dataclasses.asdict(CFG))) + "\n"
        "import mtf_core\n"
        "mtf_core.logical_devices(8)  # taken first, as a program that lowers does\n"
        "imported = [scale_workers.tensorflow_running(), scale_workers.fork_is_safe()]\n"
        "forked = plan_transformer(TransformerConfig(**json.loads(CFG)), 8, workers=2,\n"
        "    hardware='h100-nvlink-ib', memory_limit=30 * 2**20, time_limit_s=30.0)\n"
        "forked_made, made[:], helped[:] = list(made), [], []\n"
        "tensorflow.constant(1.0) + 1  # its runtime starts\n"
        "# A tf.data pipeline keeps prefetching on TensorFlow's threads meanwhile.\n"
        "data = iter(tensorflow.data.Dataset.range(10**9).map(lambda x: x * 2)\n"
        "            .prefetch(256))\n"
        "next(data)\n"
        "ran = [scale_workers.tensorflow_running(), scale_workers.fork_is_safe(),\n"
        "       scale_workers.watched_fork_possible()]\n"
        + _TWO_PROCESSES[: _TWO_PROCESSES.index("print(")]
        + "watched_made, watched_helped, made[:], helped[:] = list(made), len(helped), [], []\n"
        "# Every forked worker's job stops (fresh helpers run the module's own).\n"
        "parent, _run = os.getpid(), scale_search.SearchJobs.run\n"
        "def _stuck(self, stages, task):\n"
        "    if os.getpid() != parent:\n"
        "        time.sleep(600)\n"
        "    return _run(self, stages, task)\n"
        "_stuck.__name__ = 'run'  # a helper unpickles the job as the module's run\n"
        "scale_search.SearchJobs.run = _stuck\n"
        "said = []\n"
        "start = time.perf_counter()\n"
        "kw['memory_limit'] = 30 * 2**20\n"
        "stalled = plan_transformer(cfg, 8, workers=2,\n"
        "    progress=lambda p, f: said.append(p), **kw)\n"
        "stalled_s = time.perf_counter() - start\n"
        "stalled_made, made[:] = list(made), []\n"
        "after = [scale_workers.watched_fork_possible()]\n"
        "kw['memory_limit'] = 2 * 2**30\n"
        "again = plan_transformer(wide, 8, workers=2, **kw)\n"
        "again_made, made[:] = list(made), []\n"
        "# Where no helper can start either, the search runs in this process.\n"
        "import sys\n"
        "scale_workers._unsafe_fork_seen, sys.executable = False, ''\n"
        "kw['memory_limit'] = 30 * 2**20\n"
        "alone = plan_transformer(cfg, 8, workers=2, **kw)\n"
        "print(json.dumps({'imported': imported, 'ran': ran, "
        "'forked_made': forked_made, 'forked': out(forked), "
        "'watched_made': watched_made, 'watched_helped': watched_helped, "
        "'one': out(one), 'two': out(two), 'seen': seen, "
        "'wide_one': out(wide_one), 'wide_two': out(wide_two), "
        "'stalled': out(stalled), 'stalled_s': stalled_s, 'said': said[:3], "
        "'stalled_made': stalled_made, 'helped': len(helped), "
        "'after': after, 'again_made': again_made, 'again': out(again), "
        "'alone_made': made, 'alone': out(alone), "
        "'data': int(next(data))}))\n"
    )
    got = _in_fresh_interpreter(code, timeout=600)
    assert got["imported"] == [False, True]  # not running: a fork is safe
    assert got["forked_made"] == ["watched"]  # watched wherever it can be
    assert got["forked"] == got["one"]
    assert got["ran"] == [True, False, True]  # running: not safe unwatched
    assert got["watched_made"] == ["watched", "watched"]  # both models
    assert got["watched_helped"] > 0
    assert got["one"] == got["two"]
    assert got["wide_one"] == got["wide_two"]
    assert any("or less" in t[-1] for t in got["wide_one"][-1])
    meshes = [p for p, _ in got["seen"] if p.startswith("mesh ")]
    assert meshes and all(p.endswith("(on 2 processes)") for p in meshes)
    # The stall: found within seconds (one of stall time, then the search
    # again), the same plan from fresh helpers, and no fork since.
    assert got["stalled_made"] == ["watched", "fresh"]
    assert got["said"][0].startswith("mesh 1 of")
    assert "a forked worker stalled" in got["said"][1]
    assert got["stalled"] == got["one"]
    assert got["stalled_s"] < 60
    assert got["after"] == [False]
    assert got["again_made"] == ["fresh"] and got["again"] == got["wide_one"]
    assert got["helped"] > 0  # the helpers' results were taken
    assert got["alone_made"] == ["watched"] and got["alone"] == got["one"]
    assert got["data"] == 2  # the pipeline still serves


_CHECK_AHEAD = """
import json, time
from cost_models.pipeline import PipelineSpec
from layout_planner.scale_plan import ScaleChoice, ScaleTrial
from layout_planner.scale_sources import Ahead, FreeResult, Mesh
from layout_planner.scale_stages import Outcome

spec = PipelineSpec(1, 4, "1f1b")
meshes = [Mesh(1.0, 1, 1, 8, 4, spec), Mesh(2.0, 1, 2, 4, 4, spec)]
fewer = Mesh(1.5, 1, 1, 8, 2, PipelineSpec(1, 2, "1f1b"))
every = meshes + [fewer]

def choice(mesh):
    return ScaleChoice(1, mesh.data, mesh.tensor, mesh.micro_batches, "1f1b",
                       "none", "none")

def run(stages, task):
    kind, what = task
    if kind == "check":
        c, rules = what
        return ("priced", str(c), rules)
    i = every.index(what)
    if i == 1:
        time.sleep(0.5)  # mesh 0's worker goes idle meanwhile
    trial = ScaleTrial(choice(what), 10.0 + i, 100, True, f"batch:dp;r:{i}")
    return FreeResult(Outcome(trial, None, None), 0.0, None)

def fewer_of(c, step):
    asked.append((str(c), step))
    return [fewer] if c.micro_batches == 4 else []

asked = []
with Ahead(meshes, run, lambda: None, 2, check_ahead=True, fewer=fewer_of) as source:
    source.free(0)
    source.free(1)
    sent = sorted(map(str, source._sent))
    ahead = source.free(source.add(fewer)).outcome.trial.layout_rules
    hit = source.checked(choice(meshes[0]), "batch:dp;r:0")
    held = source.checked(choice(meshes[1]), "batch:dp;r:1")
    miss = source.checked(choice(Mesh(3.0, 1, 4, 2, 4, spec)), "batch:dp;r:3")
print(json.dumps({"hit": hit, "held": held, "miss": miss, "sent": sent,
                  "asked": asked, "ahead": ahead}))
"""


def test_an_idle_worker_runs_what_the_search_asks_for_next_ahead():
    """While the search waits for a slow mesh, the idle worker lays out the
    fastest fitting trial's fewer micro-batches (the search's next meshes
    if it stays the fastest), then prices that trial on its full stage
    graph; the search takes both.  A winner not checked ahead is priced by
    an idle worker that laid its mesh out (it holds the graphs), else by
    the search itself."""
    got = _in_fresh_interpreter(_CHECK_AHEAD)
    mesh0 = ScaleChoice(1, 8, 1, 4, "1f1b", "none", "none")
    # Sent before the search asked for mesh 2 (the fewer micro-batches):
    # every mesh's free layout and the check of mesh 0's.
    assert got["sent"] == sorted(
        map(str, [("free", 0), ("free", 1), ("free", 2),
                  ("check", (mesh0, "batch:dp;r:0"))])
    )  # fmt: skip
    assert got["asked"][0] == [str(mesh0), 10.0]
    assert got["ahead"] == "batch:dp;r:2"
    assert got["hit"] == ["priced", str(mesh0), "batch:dp;r:0"]
    mesh1 = ScaleChoice(1, 4, 2, 4, "1f1b", "none", "none")
    assert got["held"] == ["priced", str(mesh1), "batch:dp;r:1"]
    assert got["miss"] is None


# Three one-stage meshes of bounds 1, 2 and 3 s, for a ``run`` to lay out
# (with one choice), and what a ``run`` reads of its task.
_THREE_MESHES = """
import json, time
from cost_models.pipeline import PipelineSpec
from layout_planner.scale_plan import ScaleChoice, ScaleTrial
from layout_planner.scale_sources import Ahead, FreeResult, Mesh, Slower
from layout_planner.scale_stages import Outcome

spec = PipelineSpec(1, 4, "1f1b")
meshes = [Mesh(float(i), 1, 1, 8, 4, spec) for i in (1, 2, 3)]
choice = ScaleChoice(1, 8, 1, 4, "1f1b", "none", "none")

def unpack(task):  # kind, mesh index, (a joint program's) step limit
    kind, mesh = task
    limit = None
    if kind == "joint":
        mesh, limit, _ = mesh
    return kind, meshes.index(mesh), limit
"""

_DROP_BEATEN = (
    _THREE_MESHES
    + """
def run(stages, task):
    kind, i, _ = unpack(task)
    if kind == "joint":
        time.sleep(5.0 if i == 1 else 0.0)  # mesh 1's: long, and beaten
        return Outcome(ScaleTrial(choice, 20.0, 100, False, "r"), None, None)
    if i == 0:
        time.sleep(0.5)  # meanwhile the other worker runs joint programs
    trial = ScaleTrial(choice, 10.0, 100, i == 0, "r")
    return FreeResult(Outcome(trial, None, None), {0: 10.0, 1: 12.0, 2: 5.0}[i], None)

with Ahead(meshes, run, lambda: None, 2) as source:
    start = time.perf_counter()
    source.free(0)  # fits at 10 s: mesh 1's joint program (bound 12 s) is beaten
    running = [list(t) for t in source._pool.running().values()]
    sent = sorted(map(list, source._sent))
    joint = source.joint(2)
    took = time.perf_counter() - start
print(json.dumps({"running": running, "sent": sent, "took": took}))
"""
)


def test_a_worker_running_a_beaten_joint_program_is_replaced():
    """A joint program sent ahead before a fitting trial beat its bound is
    abandoned once that trial arrives (its worker replaced), so the worker is
    free for what the search needs next."""
    got = _in_fresh_interpreter(_DROP_BEATEN)
    assert got["running"] == []
    assert got["sent"] == [["free", 0], ["free", 1], ["free", 2], ["joint", 2]]
    assert got["took"] < 4.0


# Mesh 0's free layout fits at 10 s; meshes 1 and 2 do not (bounds 5 and
# 6 s).  A joint program answers Slower under the limit it was given.
_JOINT_LIMITS = (
    _THREE_MESHES
    + """
def run(stages, task):
    kind, i, limit = unpack(task)
    if kind == "joint":
        return Slower(limit, "none fits")
    if i > 0:  # mesh 0's fit is known first: a joint ahead has its limit
        time.sleep(0.3)
    trial = ScaleTrial(choice, 10.0 if i == 0 else 30.0, 100, i == 0, "r")
    return FreeResult(Outcome(trial, None, None), {0: 0.0, 1: 5.0, 2: 6.0}[i], None)

with Ahead(meshes, run, lambda: None, 2) as source:
    for i in range(3):
        source.free(i)
    # As if run ahead under a lower limit than the passes will ask for.
    source._done[("joint", 1)] = Slower(3.0, "too little")
    source._sent.add(("joint", 1))
    again = source.joint(1, 10.0)  # meanwhile the idle worker runs mesh 2's
    ahead = source.joint(2, 10.0)
print(json.dumps({"again": again.limit_s, "ahead": ahead.limit_s}))
"""
)


def test_a_joint_program_run_ahead_is_limited_to_the_fitting_step_before_it():
    """A joint program run ahead is asked for nothing slower than the
    fitting steps the passes will have seen before it (mesh 0's 10 s), and
    one answered under a lower limit than the passes ask for is run again
    under theirs (it would say too little)."""
    got = _in_fresh_interpreter(_JOINT_LIMITS)
    assert got == {"again": 10.0, "ahead": 10.0}


@pytest.mark.parametrize("memory_gib", [2, 3])
def test_a_step_limit_on_joint_programs_changes_no_trial_and_no_plan(
    monkeypatch, memory_gib
):
    """Each joint program is asked only for what beats the fastest fitting
    step before it, and leaves out the options that its bounds say cannot;
    the plan and every trial are what the programs give without that limit
    and with every option (a slower program's trial says it is slower)."""
    from layout_planner import scale_search

    real = scale_search.solve_with_recomputation
    limits: list[float | None] = []
    left_out: set[str] = set()

    def limited(problems, *args, max_time_s=None, **kwargs):
        limits.append(max_time_s)
        kept = {c.recompute_attention for c in problems}
        left_out.update({"none", "scores", "block"} - kept)
        return real(problems, *args, max_time_s=max_time_s, **kwargs)

    def unlimited(problems, *args, max_time_s=None, **kwargs):
        assert len(problems) == 3
        return real(problems, *args, **kwargs)

    # Wide enough for the projections' flops to bound whole-block
    # recomputation out of some joint programs.
    cfg = CFG.replace(d_model=2048, heads=16, d_kv=128, d_ff=8192, length=1024)
    kw = dict(
        hardware="h100-nvlink-ib", memory_limit=memory_gib * 2**30,
        time_limit_s=30.0, workers=1,
    )  # fmt: skip
    monkeypatch.setattr(scale_search, "solve_with_recomputation", limited)
    fast = plan_transformer(cfg, 8, **kw)
    monkeypatch.setattr(scale_search, "solve_with_recomputation", unlimited)
    monkeypatch.setattr(scale_search, "recompute_bound_s", lambda *a, **k: 0.0)
    slow = plan_transformer(cfg, 8, **kw)
    assert fast.trials == slow.trials
    assert fast.choice == slow.choice and fast.layout_rules == slow.layout_rules
    assert fast.step_time_s == slow.step_time_s
    assert sum(limit is not None for limit in limits) >= 2
    # Whole blocks and attention scores bounded out of some program.
    assert {"scores", "block"} <= left_out
    cut = [
        t
        for t in fast.trials
        if t.note.endswith(
            "(the step to beat: the fastest fitting one before it, or the one given)"
        )
    ]
    assert cut and all(t.step_time_s is None for t in cut)
    assert all(
        # The best step before it (printed to 6 digits): never below the plan's.
        float(t.note.split("at a step of ")[1].split(" s")[0])
        >= fast.step_time_s * (1 - 1e-5)
        for t in cut
    )


@pytest.mark.parametrize("stages", [1, 2])
def test_the_first_passs_best_gets_fewer_micro_batches_before_the_joint_programs(
    stages,
):
    """On one stage the fewer micro-batches of the first pass's fastest
    fitting trial run before the joint programs: a faster step found there
    skips each joint program whose bound it reaches (mesh 1's).  On two
    stages (a longer bubble) they run after them, on the second pass's
    best."""
    from types import SimpleNamespace

    from layout_planner.scale_plan import ScaleTrial
    from layout_planner.scale_search import _passes
    from layout_planner.scale_sources import FreeResult, InProcess, Mesh
    from layout_planner.scale_stages import Outcome

    spec = PipelineSpec(stages, 4, "1f1b")
    meshes = [Mesh(float(i), stages, 1, 8, 4, spec) for i in (1, 2, 3)]
    # Mesh 0's free layout fits (15 s); meshes 1 and 2 need their joint
    # programs (bounds 14.5 and 12 s), which fit at 12.5 and 14.8 s.
    free = {0: (15.0, True, 0.0), 1: (30.0, False, 14.5), 2: (30.0, False, 12.0)}

    def outcome(step, fits, micro_batches=4):
        c = ScaleChoice(stages, 8, 1, micro_batches, "1f1b", "none", "none")
        trial = ScaleTrial(c, step, 100, fits, f"r:{step}")
        return Outcome(trial, None, SimpleNamespace(step_time_s=step))

    asked = []

    def run(_, task):
        kind, mesh = task
        if kind == "joint":
            mesh, limit, _ = mesh
        i = meshes.index(mesh)
        asked.append((kind, i))
        if kind == "joint":
            return outcome({1: 12.5, 2: 14.8}[i], True)
        step, fits, bound = free[i]
        return FreeResult(outcome(step, fits), bound, None)

    refined = []

    def refine(best, trials, done):
        step = best.trial.step_time_s
        refined.append((step, done))
        if step == 15.0:  # two micro-batches win on mesh 0
            faster = outcome(13.0, True, micro_batches=2)
            trials.append(faster.trial)
            return faster
        return best

    def options(mesh):
        return [ScaleChoice(stages, 8, 1, 4, "1f1b", "none", "none")]

    source = InProcess(meshes, run, None)
    trials, best = _passes(meshes, options, source, None, refine=refine)
    steps = [t.step_time_s for t in trials]
    frees = [("free", 0), ("free", 1), ("free", 2)]
    assert best is not None
    if stages == 1:
        # 13 s reaches mesh 1's bound: its joint program is skipped.
        assert asked == [*frees, ("joint", 2)]
        assert refined == [(15.0, 0.8)] and best.trial.step_time_s == 13.0
        # Mesh 2's joint program (14.8 s) is slower than the 13 s before it:
        # its trial says so, as it would had the program been cut there.
        assert steps == [15.0, 30.0, 30.0, 13.0, None]
        assert "at a step of 13 s or less" in trials[-1].note
    else:
        assert asked == [*frees, ("joint", 2), ("joint", 1)]
        assert refined == [(12.5, 1.0)] and best.trial.step_time_s == 12.5
        assert steps == [15.0, 30.0, 30.0, 14.8, 12.5]


# Two meshes of STAGES stages and mesh 0's fewer micro-batches, laid out by
# forked workers; SLOW: seconds a (kind, mesh) task takes.  Mesh 0's free
# layout fits (15 s), mesh 1's does not (bound 14.5 s; its joint program
# fits at 12 s), and the fewer micro-batches fit at 13 s.
_FEWER_MESHES = """
import json, time
from cost_models.pipeline import PipelineSpec
from layout_planner.scale_plan import ScaleChoice, ScaleTrial
from layout_planner.scale_sources import Ahead, FreeResult, Mesh
from layout_planner.scale_stages import Outcome

spec = PipelineSpec(STAGES, 4, "1f1b")
data = 8 // STAGES
meshes = [Mesh(1.0, STAGES, 1, data, 4, spec), Mesh(2.0, STAGES, 2, data // 2, 4, spec)]
fewer = Mesh(1.5, STAGES, 1, data, 2, PipelineSpec(STAGES, 2, "1f1b"))
every = meshes + [fewer]

def run(stages, task):
    kind, mesh = task
    if kind == "joint":
        mesh, limit, _ = mesh
    i = every.index(mesh)
    c = ScaleChoice(STAGES, mesh.data, mesh.tensor, mesh.micro_batches, "1f1b",
                    "none", "none")
    time.sleep(SLOW.get((kind, i), 0.0))
    if kind == "joint":
        return Outcome(ScaleTrial(c, 12.0, 100, True, "r"), None, None)
    step, fits, bound = {0: (15.0, True, 0.0), 1: (30.0, False, 14.5),
                         2: (13.0, True, 0.0)}[i]
    return FreeResult(Outcome(ScaleTrial(c, step, 100, fits, "r"), None, None),
                 bound, None)

def fewer_of(c, step):
    return [fewer] if c.micro_batches == 4 else []
"""


def test_an_idle_worker_runs_the_first_passs_fewer_micro_batches_before_joints():
    got = _in_fresh_interpreter(
        # mesh 0's worker goes idle while mesh 1 is laid out
        'STAGES = 1\nSLOW = {("free", 1): 0.5}\n'
        + _FEWER_MESHES
        + """
with Ahead(meshes, run, lambda: None, 2, fewer=fewer_of) as source:
    source.free(0)
    source.free(1)
    sent = sorted(map(list, source._sent))
    idle = source._next(0)  # mesh 1's joint program: bound 14.5 s, beaten
print(json.dumps({"sent": sent, "idle": idle}))
"""
    )
    # While mesh 1 is laid out, mesh 0's fewer micro-batches (13 s).
    assert got["sent"] == [["free", 0], ["free", 1], ["free", 2]]
    # Mesh 1's joint program (bound 14.5 s) cannot beat them: not sent.
    assert got["idle"] is None


def test_fewer_micro_batches_laid_out_ahead_on_two_stages_bound_no_joint_program():
    """On two stages the passes run the joint programs before the fewer
    micro-batches: one laid out ahead (13 s) is no bound on mesh 1's
    joint program (14.5 s), which keeps running."""
    got = _in_fresh_interpreter(
        # meanwhile the other worker lays out mesh 0's fewer micro-batches
        'STAGES = 2\nSLOW = {("joint", 1): 1.0}\n'
        + _FEWER_MESHES
        + """
with Ahead(meshes, run, lambda: None, 2, fewer=fewer_of) as source:
    source.free(0)
    source.free(1)
    ahead = source.free(source.add(fewer)).outcome.trial.step_time_s
    best = source._best_step()
    joint = source.joint(1).trial.step_time_s
    sent = sorted(map(list, source._sent))
print(json.dumps({"ahead": ahead, "best": best, "joint": joint, "sent": sent}))
"""
    )
    assert got["ahead"] == 13.0
    assert got["best"] == 15.0  # the first pass's fit only
    assert got["joint"] == 12.0
    assert got["sent"] == [["free", 0], ["free", 1], ["free", 2], ["joint", 1]]


_ROUND_ENDS = """
import json
from cost_models.pipeline import PipelineSpec
from layout_planner.scale_plan import ScaleChoice, ScaleTrial
from layout_planner.scale_sources import Ahead, FreeResult, Mesh
from layout_planner.scale_stages import Outcome

meshes = [Mesh(1.0, 1, 1, 8, 8, PipelineSpec(1, 8, "1f1b"))]
fewer = {m: Mesh(1.0 + 1 / m, 1, 1, 8, m, PipelineSpec(1, m, "1f1b"))
         for m in (4, 2, 1)}
steps = {8: 15.0, 4: 13.0, 2: 14.0, 1: 12.0}

def run(stages, task):
    kind, what = task
    if kind == "check":
        return ("priced", str(what[0]), what[1])
    c = ScaleChoice(1, 8, 1, what.micro_batches, "1f1b", "none", "none")
    trial = ScaleTrial(c, steps[what.micro_batches], 100, True, "r")
    return FreeResult(Outcome(trial, None, None), 0.0, None)

def fewer_of(c, step):
    return {8: [fewer[4], fewer[2]], 4: [fewer[2], fewer[1]]}.get(c.micro_batches, [])

with Ahead(meshes, run, lambda: None, 2, check_ahead=True, fewer=fewer_of) as source:
    source.free(0)
    for m in (4, 2):
        source.free(source.add(fewer[m]))
    idle = source._next(0)
print(json.dumps({"idle": [idle[0], str(idle[1][0])]}))
"""


def test_an_idle_worker_checks_a_winner_whose_round_ends_there():
    """4 micro-batches won the round of 4 and 2 but were not its fewest:
    the search stops there (:func:`_fewer_rounds`), so an idle worker
    checks that trial instead of laying out 4's fewer micro-batches."""
    got = _in_fresh_interpreter(_ROUND_ENDS)
    assert got["idle"] == [
        "check",
        str(ScaleChoice(1, 8, 1, 4, "1f1b", "none", "none")),
    ]


def test_where_a_fork_is_unsafe_the_search_watches_its_forks_or_takes_fresh_helpers(
    monkeypatch,
):
    import os
    import threading

    from layout_planner import scale_workers
    from layout_planner.scale_search import process_kind
    from layout_planner.scale_workers import (
        default_workers,
        fork_is_safe,
        fresh_helpers_possible,
    )

    cores = max(1, min(len(os.sched_getaffinity(0)), 8))
    assert process_kind(False) == "one"
    with monkeypatch.context() as patched:
        patched.setattr(scale_workers, "tensorflow_running", lambda: False)
        assert process_kind(True) == "watched"  # wherever it can be
        patched.setattr(scale_workers, "_cpu_ticks", lambda pid: None)
        assert process_kind(True) == "forked"  # no /proc: safe unwatched
    with monkeypatch.context() as patched:  # TensorFlow's thread pools run
        patched.setattr(scale_workers, "tensorflow_running", lambda: True)
        assert not fork_is_safe() and fresh_helpers_possible()
        assert default_workers() == cores
        assert process_kind(True) == "watched"
        patched.setattr(scale_workers, "FORK_BESIDE_TENSORFLOW", False)
        assert process_kind(True) == "fresh"
        patched.setattr(scale_workers, "FORK_BESIDE_TENSORFLOW", True)
        patched.setattr(scale_workers, "_cpu_ticks", lambda pid: None)
        assert process_kind(True) == "fresh"  # no /proc: not watched
    with monkeypatch.context() as patched:  # a forked worker stalled here
        patched.setattr(scale_workers, "_unsafe_fork_seen", True)
        patched.setattr(scale_workers, "tensorflow_running", lambda: False)
        assert process_kind(True) == "fresh" and not fork_is_safe()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:  # another thread could hold a lock a fork would copy: not watched
        assert not fork_is_safe() and fresh_helpers_possible()
        assert default_workers() == cores
        assert process_kind(True) == "fresh"
    finally:
        stop.set()
        other.join()


def test_a_free_layouts_bound_is_below_every_trial_on_its_mesh():
    """The second pass skips a mesh whose free layout's proven objective is
    no better than the best step found: that objective must be below what
    the joint recomputation program finds there, on every mesh (up to the
    program's whole picoseconds)."""
    from cost_models.pipeline import PipelineSpec
    from layout_planner.program import SolveParams
    from layout_planner.scale_search import _free_trial, _trial

    hw = get_hardware("h100-nvlink-ib").with_memory(30 * 2**20)
    cfg = CFG.replace(shardable_weights=True, shardable_slots=True)
    stages = Stages(cfg, build_lm, "adam")
    params = SolveParams(30.0, 0, 0, 1)
    checked = 0
    for pp, dp, tp in ((1, 8, 1), (2, 4, 1), (2, 2, 2), (4, 2, 1), (4, 1, 2)):
        m = cfg.batch // dp
        spec = PipelineSpec(pp, m, "1f1b")
        options = [
            ScaleChoice(pp, dp, tp, m, "1f1b", a, f)
            for a, f in (("none", "none"), ("scores", "none"), ("block", "block"))
        ]
        free, bound = _free_trial(stages, options, spec, hw, params)
        assert free is not None and free.priced is not None
        assert bound <= free.priced.step_time_s * (1 + 1e-9)
        joint = _trial(stages, options, spec, hw, params)
        if joint.priced is not None:
            assert bound <= joint.priced.step_time_s * (1 + 1e-9)
            checked += 1
    assert checked >= 4


def test_the_collector_is_paused_for_the_search_and_restored(monkeypatch):
    import gc

    from layout_planner import scale_search

    seen = []
    search = scale_search.search

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return search(*args, **kwargs)

    monkeypatch.setattr(scale_search, "search", spy)
    small = CFG.replace(num_layers=4, d_model=64, d_ff=128, batch=8)
    assert gc.isenabled()
    plan = plan_transformer(small, 8, workers=1)
    # One search, over the meshes and then fewer micro-batches.
    assert seen and not any(seen) and gc.isenabled() and plan.fits
    gc.disable()  # a caller that paused it keeps it paused
    try:
        before = len(seen)
        plan_transformer(small, 8, workers=1)
        assert len(seen) > before and not any(seen) and not gc.isenabled()
    finally:
        gc.enable()


def test_the_search_solves_without_cp_sat_presolve(monkeypatch):
    # Without it the search's many small programs solve in about half the
    # time (bench/cpsat_presolve.py), and the planner's settings make
    # presolve call some feasible tie-break programs infeasible.
    from layout_planner import cpsat

    seen = []
    solve = cpsat.cp_model.CpSolver.solve

    def spy(self, model, *args, **kwargs):
        seen.append(self.parameters.cp_model_presolve)
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cpsat.cp_model.CpSolver, "solve", spy)
    small = CFG.replace(num_layers=4, d_model=64, d_ff=128, batch=8)
    plan = plan_transformer(small, 8, workers=1)
    assert plan.fits and len(seen) >= len(plan.trials)
    assert not any(seen)


def test_a_pipelined_trial_is_the_fastest_layout_that_fits_with_its_micro_batches():
    # Every (recomputation, layout) of a 6-layer stage on dp:2;tp:2 with 2
    # micro-batches in flight, priced as a trial prices it: under capacities
    # that rule out some, the trial's answer is the fastest that fits.
    hw = get_hardware("h100-nvlink-ib")
    stages = Stages(CFG, build_lm, "adam")
    options = [
        ScaleChoice(2, 2, 2, 8, "1f1b", a, f)
        for a, f in (("none", "none"), ("scores", "none"), ("block", "block"))
    ]
    spec = PipelineSpec(2, 8, "1f1b")
    assert spec.in_flight == 2
    priced = []
    for c in options:
        stage = stages.stage(c, hw)
        problem = stage.problem
        dims = problem.free_dims
        for axes in itertools.product(*[[None, *problem.allowed[d]] for d in dims]):
            asg = dict(zip(dims, axes))
            if problem.table_cost(asg).invalid is not None:
                continue
            rules = problem.rules_for(asg)
            cfg1 = stages.stage_config(c, 1)
            p = price_step(stage.parts(rules), rules, c, spec, cfg1, hw)
            priced.append((p.step_time_s, p.peak_memory_bytes))
    assert len(priced) > 300
    peaks = sorted({peak for _, peak in priced})
    params = SolveParams(30.0, 1, 0, 1, presolve=False)
    for limit in (peaks[len(peaks) // 8], peaks[len(peaks) // 2]):
        best = min(step for step, peak in priced if peak <= limit)
        fastest = min(step for step, _ in priced)
        assert best > fastest  # the capacity binds
        got = _trial(stages, options, spec, hw.with_memory(limit), params)
        assert got.trial.fits and got.trial.peak_memory_bytes <= limit
        assert got.trial.step_time_s == pytest.approx(best, rel=1e-9)
    # Below every layout's peak: no answer fits.
    got = _trial(stages, options, spec, hw.with_memory(peaks[0] - 1), params)
    assert not got.trial.fits


def test_a_pipelined_layout_is_chosen_with_its_stage_to_stage_sends():
    # A slow pipeline link makes the boundary activation's slice matter: the
    # free layout is the fastest pipelined step of every layout, sends
    # included (not the fastest stage plus whatever its sends cost), and
    # the program's proven bound is that step, so it bounds the mesh.
    import dataclasses

    from cost_models.hardware import LinkSpec
    from layout_planner.scale_search import _free_trial

    slow = LinkSpec("slow pipeline link", 2e8, 1e-5)
    hw = dataclasses.replace(get_hardware("h100-nvlink-ib"), axis_links=(("pp", slow),))
    stages = Stages(CFG, build_lm, "adam")
    choice = ScaleChoice(2, 2, 2, 16, "1f1b", "none", "none")
    spec = PipelineSpec(2, 16, "1f1b")
    stage = stages.stage(choice, hw)
    problem = stage.problem
    cfg1 = stages.stage_config(choice, 1)
    priced = []
    for axes in itertools.product(
        *[[None, *problem.allowed[d]] for d in problem.free_dims]
    ):
        asg = dict(zip(problem.free_dims, axes))
        table = problem.table_cost(asg)
        if table.invalid is not None:
            continue
        rules = problem.rules_for(asg)
        step = price_step(stage.parts(rules), rules, choice, spec, cfg1, hw).step_time_s
        without_sends = problem.weighted_time_s(table) - table.extra_s
        priced.append((step, without_sends))
    assert len(priced) > 100
    best = min(step for step, _ in priced)
    # Chosen by the stage's time alone, the step would be slower.
    _, first = min(priced, key=lambda p: p[1])
    assert min(step for step, w in priced if w == first) > best * 1.2
    params = SolveParams(30.0, 0, 0, 1, presolve=False)
    free, bound = _free_trial(stages, [choice], spec, hw, params)
    assert free is not None and free.trial.fits
    assert free.trial.step_time_s == pytest.approx(best, rel=1e-9)
    assert bound == pytest.approx(best, rel=1e-9)


def test_each_free_layout_starts_from_the_last_one_this_process_found(monkeypatch):
    from layout_planner import scale_search

    searches: list[list] = []
    solve, search = scale_search.solve_stage, scale_search.search

    def spy(stage, limit, params, hint=None):
        plan = solve(stage, limit, params, hint)
        searches[-1].append((hint, plan.layout_rules))
        return plan

    def each_search(*args, **kwargs):
        searches.append([])
        return search(*args, **kwargs)

    monkeypatch.setattr(scale_search, "solve_stage", spy)
    monkeypatch.setattr(scale_search, "search", each_search)
    small = CFG.replace(num_layers=4, d_model=64, d_ff=128, batch=8)
    hinted = plan_transformer(small, 8, workers=1)
    assert len(searches[0]) >= 3
    for seen in searches:  # the meshes', then fewer micro-batches'
        assert seen[0][0] is None
        for (_, before), (hint, _) in zip(seen, seen[1:]):
            assert hint == before
    # The hints change how soon CP-SAT finds each answer, not the answers.
    monkeypatch.setattr(
        scale_search, "solve_stage", lambda s, lim, p, hint=None: solve(s, lim, p)
    )
    monkeypatch.setattr(scale_search, "search", search)
    _same_plan(hinted, plan_transformer(small, 8, workers=1))


def test_the_micro_batch_count_is_the_fastest_on_the_chosen_mesh():
    # On this small model fixed costs per micro-batch (collectives' latency,
    # the sends) outweigh the longer bubble: fewer, larger micro-batches win.
    kw = dict(hardware="h100-nvlink-ib", workers=1)
    plan = plan_transformer(CFG, 8, **kw)
    c = plan.choice
    m0 = CFG.batch // c.data  # one sequence per data-parallel replica
    steps = {}
    for m in (m0, m0 // 2, m0 // 4):
        fixed = plan_transformer(
            CFG, 8, stages=[c.stages], tensor=[c.tensor], micro_batches=m, **kw
        )
        assert fixed.choice.micro_batches == m and fixed.fits
        assert {t.choice.micro_batches for t in fixed.trials} == {m}
        steps[m] = fixed.step_time_s
    assert c.micro_batches == min(steps, key=steps.__getitem__) < m0
    assert plan.step_time_s == pytest.approx(steps[c.micro_batches], rel=1e-9)
    # The counts tried on the mesh are among the trials, and explain() sets
    # them side by side.
    on_mesh = {
        t.choice.micro_batches
        for t in plan.trials
        if (t.choice.stages, t.choice.data, t.choice.tensor)
        == (c.stages, c.data, c.tensor)
    }
    assert {m0, c.micro_batches} <= on_mesh
    text = plan.explain()
    assert f"on this mesh, {m0} micro-batches" in text
    assert f"on this mesh, {c.micro_batches} micro-batches" in text


@pytest.mark.parametrize("workers", [1, 2])
def test_a_search_given_a_step_to_beat_says_when_nothing_beats_it(workers):
    from cost_models.pipeline import PipelineSpec
    from layout_planner import scale_search
    from layout_planner.choices import RECOMPUTE_TRIALS, model_flops

    hw = get_hardware("h100-nvlink-ib")
    cfg = CFG.replace(shardable_weights=True, shardable_slots=True)
    meshes = [
        scale_search.Mesh(0.0, 4, 1, 2, m, PipelineSpec(4, m, "1f1b")) for m in (8, 4)
    ]

    def search(**kw):
        return scale_search.search(
            cfg, meshes, hw, build_lm, "adam", "1f1b", RECOMPUTE_TRIALS, 30.0,
            model_flops(cfg), 8, workers=workers, **kw,
        )  # fmt: skip

    plan = search()
    assert plan.choice.micro_batches == 8  # (the faster of the two)
    # Given its own step, nothing beats it: an error that keeps the trials.
    with pytest.raises(scale_search.NothingFaster, match="no trial beats") as e:
        search(incumbent_s=plan.step_time_s)
    assert e.value.trials and all(t.choice.stages == 4 for t in e.value.trials)
    # A little slower than it, the same plan comes back.
    again = search(incumbent_s=plan.step_time_s * 1.001)
    assert again.choice == plan.choice and again.step_time_s == plan.step_time_s


def test_a_meshs_recomputation_options_share_their_equal_tables():
    """The stage problems of one mesh (one pricer) copy each table whose
    dims, assignments and units (signatures and counts) a problem before
    them priced, and those tables are what pricing afresh gives."""
    from layout_planner.problem import LayoutProblem

    hw = get_hardware("h100-nvlink-ib")
    cfg = CFG.replace(shardable_weights=True, shardable_slots=True)
    stages = Stages(cfg, build_lm, "adam")
    options = [
        ScaleChoice(2, 2, 2, 16, "1f1b", a, f)
        for a, f in (("none", "none"), ("scores", "none"), ("block", "block"))
    ]
    problems = [stages.stage(c, hw).problem for c in options]
    pricer = problems[0]._given_pricer
    assert all(p is not None and p._given_pricer is pricer for p in problems)
    total = sum(len(p.tables) for p in problems)
    # Fewer tables priced than the three problems hold: the rest were copied.
    assert 0 < len(pricer.tables) < total - len(problems[0].tables) // 2
    for p in problems:
        fresh = LayoutProblem(
            p.graph, p.mesh_shape, hw, p.outputs, analysis=p.analysis,
            per_batch_weight=p.per_batch_weight,
        )  # fmt: skip
        assert [t.dims for t in fresh.tables] == [t.dims for t in p.tables]
        for got, want in zip(p.tables, fresh.tables):
            assert got.assignments == want.assignments
            assert got.time_s == want.time_s and got.once_s == want.once_s
            assert got.compute_s == want.compute_s and got.comm_s == want.comm_s
            assert got.buffer_bytes == want.buffer_bytes
            assert got.invalid == want.invalid and got.ordered == want.ordered

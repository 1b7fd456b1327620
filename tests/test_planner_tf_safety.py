"""CP-SAT and TensorFlow in one process.

OR-tools 9.15's CP-SAT segfaults in ``Solve`` when TensorFlow 2.21 was loaded
first and OR-tools is imported the ordinary way (Mesh TensorFlow's auto_mtf
crashed the same way).  The planner imports OR-tools with ``RTLD_DEEPBIND``
(``layout_planner.solver_process.cp_sat_import``), so it solves in process in
either order; the worker process is left for an OR-tools imported by someone
else after TensorFlow, or when forced.  Each case runs in its own interpreter,
so a crash fails the test instead of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.solver]

PLAN = """
import mtf_core as mtf
g = mtf.Graph(); m = mtf.Mesh(g, "m")
x = mtf.zeros(m, "a:10,b:5"); y = mtf.zeros(m, "b:5,c:20")
z = mtf.einsum([x, y], "a:10,c:20")
plan = mtf.auto_layout(g, "m1:4,m2:2", [z], objective="memory")
assert str(plan.layout_rules) == "a:m2;c:m1", plan.layout_rules
print(plan.solver.solved_in)
"""
TF_OP = "import tensorflow as tf\nprint(tf.reduce_sum(tf.ones([3])).numpy())\n"
# A small CP-SAT model with a known optimum: 200 Booleans, no two neighbours
# both true; at most 100 can be.
RAW_SOLVE = """
def raw_solve(cp_model, workers):
    m = cp_model.CpModel()
    xs = [m.new_bool_var(f"x{i}") for i in range(200)]
    for i in range(199):
        m.add_at_most_one(xs[i], xs[i + 1])
    m.maximize(sum(xs))
    s = cp_model.CpSolver()
    s.parameters.num_workers = workers
    assert s.solve(m) == cp_model.OPTIMAL and s.objective_value == 100
    print("raw", workers)
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
    )


def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    return done.stdout.split()


def test_after_tensorflow_the_planner_solves_in_process_and_tensorflow_still_works(
    tmp_path,
) -> None:
    # One interpreter that loaded TensorFlow (and ran an op) first: a plan, a
    # model of 10,000 Booleans on CP-SAT's 8-worker portfolio (where
    # interposed synchronization primitives would show first), and the
    # planner service in the same process, its plan equal to a local one.
    code = (
        TF_OP
        + PLAN
        + """
from layout_planner import solver_process
print(solver_process.how_loaded())
from layout_planner.cpsat import cp_model
from layout_planner.program import SMALL_PROGRAM_VARIABLES
m = cp_model.CpModel()
n = SMALL_PROGRAM_VARIABLES * 2
xs = [m.new_bool_var(f"x{i}") for i in range(n)]
for i in range(n - 1):
    m.add_at_most_one(xs[i], xs[i + 1])
for i in range(0, n - 7, 7):
    m.add_bool_or(xs[i : i + 7])
m.maximize(sum((i % 5 + 1) * x for i, x in enumerate(xs)))
s = cp_model.CpSolver()
s.parameters.num_workers = 8
s.parameters.max_time_in_seconds = 60
status = s.solve(m)
assert status in (cp_model.OPTIMAL, cp_model.FEASIBLE), status
print("portfolio", n)
"""
        + f"""
import sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from fastapi.testclient import TestClient
from api.main import create_app
from api_cases import mlp_doc, service_settings
doc = mlp_doc()
with TestClient(create_app(service_settings({str(tmp_path)!r}))) as client:
    r = client.post("/v1/plans", json={{"graph": doc, "mesh_shape": "x:2;y:2",
                                       "hardware": "h100-nvlink-ib", "top_k": 3}})
    assert r.status_code == 200, r.text
    served = r.json()["layout_rules"]
loaded = mtf.graph_from_dict(doc)
local = mtf.auto_layout(loaded.graph, "x:2;y:2", outputs=loaded.outputs,
                        hardware="h100-nvlink-ib", top_k=3)
print("service", served == str(local.layout_rules), local.solver.solved_in)
"""
        + TF_OP
    )
    assert lines(run(code)) == [
        "3.0",
        "inprocess",
        "deepbind",
        "portfolio",
        "10000",
        "service",
        "True",
        "inprocess",
        "3.0",
    ]


def test_after_tensorflow_many_solves_on_several_workers_agree_with_a_clean_worker() -> (
    None
):
    # Transformer plans on meshes of one to three axes, each with one and four
    # CP-SAT workers, both objectives and top 3, in a process that loaded
    # TensorFlow (and ran a TF op) first; each request again in the clean
    # worker process (forced by the environment): the same ranked layouts.
    code = (
        TF_OP
        + """
import json, os
import mtf_core as mtf
from mtf_core.models import TransformerConfig, build_lm
model = build_lm(TransformerConfig(num_layers=2, d_model=16, heads=4, d_kv=4,
                                   d_ff=32, vocab=64, length=8, batch=8),
                 optimizer="adam")
out = []
for mesh in ["x:8", "x:2;y:4", "x:2;y:2;z:2", "x:4;y:4;z:4"]:
    for workers in (1, 4):
        for objective in ("time", "memory"):
            got = []
            for where in ("", "subprocess"):
                os.environ["MTF_PLANNER_SOLVER"] = where
                plan = mtf.auto_layout(model.graph, mesh, [model.loss],
                                       "h100-nvlink-ib", objective, top_k=3,
                                       num_workers=workers)
                assert plan.status.value == "optimal", plan.status
                got.append([plan.solver.solved_in,
                            [str(c.layout_rules) for c in plan.candidates]])
            out.append(got)
print(json.dumps(out))
"""
        + TF_OP
    )
    done = run(code)
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    *_, result, tf_after = done.stdout.splitlines()
    assert tf_after == "3.0"
    plans = json.loads(result)
    assert len(plans) == 16
    for (where, ranked), (clean_where, clean_ranked) in plans:
        assert (where, clean_where) == ("inprocess", "subprocess")
        # Proven optimal with a unique tie-break: the same ranked layouts.
        assert ranked == clean_ranked and len(ranked) >= 1


def test_planner_loaded_first_then_tensorflow_both_keep_working() -> None:
    code = (
        PLAN
        + TF_OP
        + PLAN
        + RAW_SOLVE
        + "from layout_planner.cpsat import cp_model\nraw_solve(cp_model, 8)\n"
        + TF_OP
    )
    assert lines(run(code)) == [
        "inprocess",
        "3.0",
        "inprocess",
        "raw",
        "8",
        "3.0",
    ]


def test_ortools_imported_plainly_after_tensorflow_falls_back_to_the_worker() -> None:
    # Someone else imported OR-tools the ordinary way after TensorFlow: the
    # planner cannot know it is safe, so it solves in the worker process.
    code = (
        "import tensorflow\nfrom ortools.sat.python import cp_model\n"
        + PLAN
        + "from layout_planner import solver_process\n"
        + "print(solver_process.how_loaded())\n"
    )
    assert lines(run(code)) == ["subprocess", "after-tf"]


@pytest.mark.slow
def test_a_plain_ortools_import_after_tensorflow_crashes_which_is_why_deepbind() -> (
    None
):
    code = (
        "import tensorflow\nfrom ortools.sat.python import cp_model\n"
        + RAW_SOLVE
        + "raw_solve(cp_model, 1)\n"
    )
    done = run(code)
    assert done.returncode < 0, (
        "CP-SAT no longer crashes after a plain import behind TF: "
        "cp_sat_import's RTLD_DEEPBIND may no longer be needed"
    )

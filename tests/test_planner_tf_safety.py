"""CP-SAT and TensorFlow in one process.

OR-tools 9.15's CP-SAT segfaults in ``Solve`` when TensorFlow 2.21 was loaded
first (Mesh TensorFlow's auto_mtf crashed the same way).  The planner then
solves in a clean worker process; with OR-tools loaded first it solves in
place.  Each case runs in its own interpreter, so a crash fails the test
instead of killing pytest.
"""

from __future__ import annotations

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


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
    )


def test_tensorflow_loaded_first_solves_in_a_worker_process() -> None:
    code = (
        "import tensorflow as tf\n"
        + PLAN
        + "print(tf.reduce_sum(tf.ones([3])).numpy())\n"
    )
    done = run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["subprocess", "3.0"]


def test_planner_loaded_first_solves_in_place_and_tensorflow_still_works() -> None:
    code = (
        PLAN
        + "import tensorflow as tf\nprint(tf.reduce_sum(tf.ones([3])).numpy())\n"
        + PLAN
    )
    done = run(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["inprocess", "3.0", "inprocess"]


@pytest.mark.slow
def test_forcing_in_process_after_tensorflow_crashes_which_is_why_the_worker_exists() -> (
    None
):
    done = run("import tensorflow\n" + PLAN, MTF_PLANNER_SOLVER="inprocess")
    assert done.returncode < 0, "CP-SAT no longer crashes after TF: the worker may go"

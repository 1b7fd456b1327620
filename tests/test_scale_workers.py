"""The scale search's forked workers (layout_planner.scale_workers): each keeps
its state between jobs, a job's exception comes back, a dead worker is named.
Each case runs in a fresh interpreter: forking needs a process without
TensorFlow, which a test worker may have loaded."""

from __future__ import annotations

import json
import subprocess
import sys

_PRELUDE = """
import json, os
from layout_planner.scale_workers import WorkerError, Workers
made = []
def make_state():
    return {"pid": os.getpid(), "jobs": 0}
def job(state, item):
    state["jobs"] += 1
    if item == "boom":
        raise ValueError("item 'boom' is not a number")
    if item == "die":
        os._exit(3)
    if item == "lambda":
        return lambda: 1
    if item == "slow":
        import time
        time.sleep(1.0)
    if item == "nap":  # no progress: as a child stopped on a lock would be
        import time
        time.sleep(5.0)
    if item == "spin":  # a second of CPU
        import time
        end = time.process_time() + 1.0
        while time.process_time() < end:
            pass
    return (state["pid"], state["jobs"], item * 2)
def raised(pool, kind):  # what pool.finished() raised of kind (None: returned)
    try:
        pool.finished()
    except kind as e:
        return str(e)
    return None
def run(pool, w, items):
    out = []
    for k, item in enumerate(items):
        pool.submit(w, k, item)
        got = pool.finished()
        out.append(got)
    return out
"""


def _run(body: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict = json.loads(done.stdout.splitlines()[-1])
    return result


def test_each_worker_keeps_its_state_between_jobs():
    got = _run(
        """
with Workers(job, make_state, 2) as pool:
    a = run(pool, 0, [1, 2, 3])
    b = run(pool, 1, [10])
    pool.submit(0, "x", 4)
    pool.submit(1, "y", 5)
    both = []
    while pool.busy():
        both += pool.finished()
print(json.dumps({"a": a, "b": b, "both": sorted(both), "me": os.getpid()}))
"""
    )
    a = [r[0] for r in got["a"]]
    pid = a[0][1][0]
    assert pid != got["me"]  # a forked process
    assert [k for k, _ in a] == [0, 1, 2]
    assert [v for _, v in a] == [[pid, 1, 2], [pid, 2, 4], [pid, 3, 6]]
    ((key, (other, jobs, value)),) = got["b"][0]
    assert other not in (pid, got["me"]) and jobs == 1 and value == 20
    assert got["both"] == [["x", [pid, 4, 8]], ["y", [other, 2, 10]]]


def test_closed_workers_end_and_are_reaped_without_being_waited_for():
    got = _run(
        """
import multiprocessing, signal, time
with Workers(job, make_state, 2) as pool:
    pool.submit(0, "busy", "slow")  # abandoned mid-job
    run(pool, 1, [1])
    procs = list(pool._procs)
pids = [p.pid for p in procs]
deadline = time.monotonic() + 30
while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
    time.sleep(0.01)  # exitcode polls, as multiprocessing reaps them
codes = [p.exitcode for p in procs]
left = [c.pid for c in multiprocessing.active_children()]
with Workers(job, make_state, 1) as again:  # forking goes on as before
    (nxt,) = run(again, 0, [5])
gone = [os.path.exists(f"/proc/{pid}") for pid in pids]
print(json.dumps({"codes": codes, "sig": -signal.SIGTERM, "left": left,
                  "pids": pids, "gone": gone, "next": nxt}))
"""
    )
    # Both stopped by the terminate of close(), the busy one mid-job; none
    # left behind as a child or a zombie.
    assert got["codes"] == [got["sig"], got["sig"]]
    assert not set(got["left"]) & set(got["pids"])
    assert got["gone"] == [False, False]
    ((key, (_, jobs, value)),) = got["next"]
    assert (key, jobs, value) == (0, 1, 10)


def test_a_jobs_exception_is_raised_in_the_parent():
    got = _run(
        """
with Workers(job, make_state, 1) as pool:
    pool.submit(0, "k", "boom")
    try:
        pool.finished()
        raised = None
    except ValueError as e:
        raised = [str(e), e.__notes__[0]]
    after = run(pool, 0, [7])  # the worker goes on
    pool.submit(0, "f", "lambda")
    try:
        pool.finished()
        unsent = None
    except WorkerError as e:
        unsent = str(e)
print(json.dumps({"raised": raised, "after": after, "unsent": unsent}))
"""
    )
    message, note = got["raised"]
    assert message == "item 'boom' is not a number"
    # The worker's traceback comes along for whoever reads the error's log.
    assert note.startswith("in a search worker:\nTraceback")
    assert ", in job\n" in note
    assert note.endswith("ValueError: item 'boom' is not a number")
    assert got["after"][0][0][1][1:] == [2, 14]
    assert got["unsent"].startswith("a search job's result: ")


def test_a_dead_worker_and_misuse_are_named():
    got = _run(
        """
errors = []
with Workers(job, make_state, 1) as pool:
    try:
        pool.finished()
    except WorkerError as e:
        errors.append(str(e))
    pool.submit(0, "first", 1)
    try:
        pool.submit(0, "second", 2)
    except WorkerError as e:
        errors.append(str(e))
    pool.finished()
    pool.submit(0, "fatal", "die")
    try:
        pool.finished()
    except WorkerError as e:
        errors.append(str(e))
print(json.dumps(errors))
"""
    )
    assert got == [
        "no job is running",
        "worker 0 is still running 'first'",
        "search worker 0 died running 'fatal'",
    ]


def test_no_workers_where_a_fork_is_unsafe():
    got = _run(
        """
from layout_planner import scale_workers
scale_workers.tensorflow_running = lambda: True  # its thread pools run
try:
    Workers(job, make_state, 2)
    print(json.dumps("forked"))
except WorkerError as e:
    print(json.dumps(str(e)))
"""
    )
    assert got == "this process cannot fork workers safely"


def test_a_watched_worker_that_stalls_or_dies_ends_forking_here():
    # Beside TensorFlow's running threads a fork is not safe unwatched, but
    # watched: a worker busy on the CPU is left to run; one whose CPU time
    # stands still for the stall time, or that dies, raises UnsafeFork, and
    # this process forks no more, watched or not.
    got = _run(
        """
import time
from layout_planner import scale_workers
from layout_planner.scale_workers import UnsafeFork, watched_fork_possible
scale_workers.tensorflow_running = lambda: True  # its thread pools run
possible = [scale_workers.fork_is_safe(), watched_fork_possible()]
refused = []
for kw in ({}, {"watch": True, "stall_s": float("nan")},
           {"watch": True, "fresh": True}):
    try:
        Workers(job, make_state, 1, **kw)
    except WorkerError as e:
        refused.append(str(e))
with Workers(job, make_state, 2, watch=True, stall_s=0.3) as pool:
    (spun,) = run(pool, 0, ["spin"])
    pool.submit(1, "stuck", "nap")
    start = time.perf_counter()
    stalled = raised(pool, UnsafeFork)
    waited = time.perf_counter() - start
scale_workers.tensorflow_running = lambda: False  # not even where safe
after = [watched_fork_possible(), scale_workers.fork_is_safe()]
scale_workers.tensorflow_running = lambda: True
try:
    Workers(job, make_state, 1, watch=True)
except WorkerError as e:
    refused.append(str(e))
scale_workers._unsafe_fork_seen = False  # as in a fresh process
with Workers(job, make_state, 1, watch=True) as pool:
    pool.submit(0, "d", "die")
    died = raised(pool, UnsafeFork)
print(json.dumps({"possible": possible, "refused": refused, "spun": spun,
                  "stalled": stalled, "waited": waited, "after": after,
                  "died": died, "seen": scale_workers._unsafe_fork_seen}))
"""
    )
    assert got["possible"] == [False, True]
    assert got["refused"] == [
        "this process cannot fork workers safely",
        "stall_s must be a positive number of seconds, got nan",
        "only forked workers are watched",
        "this process cannot fork watched workers",
    ]
    ((key, (_, jobs, value)),) = got["spun"]
    assert (key, jobs, value) == (0, 1, "spinspin")  # busy, not stalled
    assert got["stalled"].startswith("search worker 1 made no progress for ")
    assert got["stalled"].endswith(" s running 'stuck'")
    assert got["waited"] < 4.0  # found before the nap's 5 s were over
    assert got["after"] == [False, False]
    assert got["died"] == "search worker 0 died running 'd'"
    assert got["seen"] is True


def test_tensorflow_runs_once_its_thread_pools_start_not_when_imported():
    # The setup of a program that lowers on logical CPUs (list the CPU, split
    # it) starts nothing; a graph's first op starts its thread pools.
    got = _run(
        """
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
from layout_planner.scale_workers import tensorflow_running
seen = [tensorflow_running()]
import tensorflow as tf
seen.append(tensorflow_running())
cpu = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpu[0], [tf.config.LogicalDeviceConfiguration()] * 8)
seen.append(tensorflow_running())
with tf.Graph().as_default():
    tf.constant(1.0)
seen.append(tensorflow_running())
print(json.dumps(seen))
"""
    )
    assert got == [False, False, False, True]


def test_no_workers_in_a_daemonic_process():
    got = _run(
        """
import multiprocessing
from layout_planner.scale_workers import (
    default_workers, fork_is_safe, fresh_helpers_possible,
)
def child(q):
    q.put([fork_is_safe(), fresh_helpers_possible(), default_workers()])
ctx = multiprocessing.get_context("fork")
q = ctx.Queue()
p = ctx.Process(target=child, args=(q,), daemon=True)
p.start()
inside = q.get(timeout=60)
p.join()
print(json.dumps([fork_is_safe(), inside]))
"""
    )
    assert got == [True, [False, False, 1]]


def test_a_worker_whose_parent_died_ends_quietly():
    # The parent exits while its worker runs a job; the worker finishes,
    # finds no one to answer and ends without a traceback.  Its stderr is
    # the parent's, which the run below reads to its end.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PRELUDE
            + """
pool = Workers(job, make_state, 1)
pool.submit(0, "k", "slow")
os._exit(0)
""",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0
    assert "Traceback" not in done.stderr, done.stderr


def test_ctrl_c_stops_the_parent_and_its_workers_without_their_tracebacks():
    # SIGINT to the whole process group, as a terminal's Ctrl-C sends it.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PRELUDE
            + """
import signal, time
with Workers(job, make_state, 2) as pool:
    run(pool, 0, [1])  # both workers up and serving
    run(pool, 1, [1])
    pool.submit(0, "a", "slow")
    pool.submit(1, "b", "slow")
    try:
        os.killpg(os.getpgrp(), signal.SIGINT)
        time.sleep(5)
        print(json.dumps("not interrupted"))
    except KeyboardInterrupt:
        print(json.dumps("interrupted"))
""",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == '"interrupted"'
    assert "Traceback" not in done.stderr, done.stderr


def test_a_replaced_worker_abandons_its_job_and_starts_afresh():
    got = _run(
        """
import time
with Workers(job, make_state, 2) as pool:
    (first,) = run(pool, 0, [1])
    pool.submit(0, "stuck", "slow")
    pool.submit(1, "other", 2)
    other = pool.finished()  # the stuck job sleeps a second
    before = pool.running()
    start = time.perf_counter()
    pool.replace(0)
    after = pool.running()
    (fresh,) = run(pool, 0, [3])
    waited = time.perf_counter() - start
print(json.dumps({"first": first, "other": other, "before": before,
                  "after": after, "fresh": fresh, "waited": waited}))
"""
    )
    ((_, (old, jobs, _)),) = got["first"]
    assert [k for k, _ in got["other"]] == ["other"]
    assert got["before"] == {"0": "stuck"} and got["after"] == {}
    ((key, (new, fresh_jobs, value)),) = got["fresh"]
    assert new != old and (key, fresh_jobs, value) == (0, 1, 6)  # a new state
    assert jobs == 1 and got["waited"] < 0.9  # not after the stuck job's second


_FRESH = """
import os, sys
sys.path.insert(0, {tests!r})
from layout_planner import scale_workers
scale_workers.tensorflow_running = lambda: True  # its thread pools run: no fork
scale_workers.FORK_BESIDE_TENSORFLOW = False  # and no watched fork either
from scale_worker_jobs import job, make_state
"""


def test_fresh_helpers_serve_where_a_fork_is_unsafe():
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    got = _run(
        _FRESH.format(tests=tests)
        + """
import gc
from layout_planner.scale_workers import default_workers, fork_is_safe
gc.disable()  # as the search does: its helpers collect no more than forks
with Workers(job, make_state, 2, fresh=True) as pool:
    # Not idle until each has imported the planner and said so.
    starting = [pool.idle(), pool.busy(), pool.finished(timeout=0.0)]
    while pool.idle() != [0, 1]:
        assert pool.finished() == []
    pool.submit(0, "a", 1)
    pool.submit(1, "b", 2)
    firsts = []
    while len(firsts) < 2:
        firsts += pool.finished()
    pool.submit(0, "m", "modules")
    (modules,) = pool.finished()
    pool.submit(0, "c", 3)
    (again,) = pool.finished()
    pool.submit(1, "x", "boom")
    try:
        pool.finished()
        raised = None
    except ValueError as e:
        raised = str(e)
    gc.enable()  # a helper started now collects
    pool.replace(1)
    after = pool.idle()
    while 1 not in pool.idle():
        pool.finished()
    pool.submit(1, "d", 4)
    (fresh,) = pool.finished()
    pool.submit(1, "m", "modules")
    (collects,) = pool.finished()
print(json.dumps({"starting": starting, "firsts": sorted(firsts),
                  "modules": modules, "again": again, "raised": raised,
                  "after": after, "fresh": fresh, "me": os.getpid(),
                  "collects": collects,
                  "fork": fork_is_safe(), "default": default_workers()}))
"""
    )
    assert got["starting"] == [[], True, []]
    (ka, (pid_a, n_a, v_a)), (kb, (pid_b, n_b, v_b)) = got["firsts"]
    assert (ka, n_a, v_a, kb, n_b, v_b) == ("a", 1, 2, "b", 1, 4)
    assert len({pid_a, pid_b, got["me"]}) == 3
    # Its own interpreter: no TensorFlow, OR-tools loaded before a job; the
    # collector paused or not as this process's was when it started.
    assert got["modules"] == ["m", [False, True, False]]
    assert got["collects"] == ["m", [False, True, True]]
    assert got["again"] == ["c", [pid_a, 3, 6]]  # state kept between jobs
    assert "is not a number" in got["raised"]
    assert got["after"] == [0]  # the replacement starts afresh
    fresh_pid, jobs, value = got["fresh"][1]
    assert fresh_pid not in (pid_a, pid_b) and (jobs, value) == (1, 8)
    assert not got["fork"] and got["default"] > 1


def test_a_helper_that_cannot_start_is_lost_and_the_search_goes_on_without_it():
    import os

    tests = os.path.dirname(os.path.abspath(__file__))
    got = _run(
        _FRESH.format(tests=tests)
        + """
def unknown(state, item):  # __main__'s: a helper cannot unpickle it
    return item
with Workers(unknown, make_state, 1, fresh=True) as pool:
    while pool.busy():
        assert pool.finished() == []
    lost = [sorted(pool.lost), pool.idle(), pool.finished(timeout=0.0)]
# A search whose helper cannot even start plans in this process alone.
from layout_planner.choices import plan_transformer
from mtf_core.models import TransformerConfig
cfg = TransformerConfig(num_layers=4, d_model=64, heads=4, d_kv=16, d_ff=256,
                        vocab=128, length=32, batch=16)
alone = plan_transformer(cfg, 8, "h100-nvlink-ib", workers=1)
sys.executable = "/bin/false"
seen = []
helped = plan_transformer(cfg, 8, "h100-nvlink-ib", workers=2,
                          progress=lambda p, f: seen.append(p))
def out(plan):
    return [str(plan.choice), plan.layout_rules, plan.step_time_s,
            [(str(t.choice), t.step_time_s, t.fits, t.note) for t in plan.trials]]
print(json.dumps({"lost": lost, "alone": out(alone), "helped": out(helped),
                  "seen": [p for p in seen if p.startswith("mesh ")][:1]}))
"""
    )
    assert got["lost"] == [[0], [], []]
    assert got["helped"] == got["alone"]
    assert got["seen"][0].endswith("(on 2 processes)")  # the helper was asked

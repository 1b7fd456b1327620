"""``mtf.logical_devices``: the CPU split into logical devices, configured
without starting TensorFlow's runtime (so a program that takes its devices
first can still plan on forked workers), in a fresh interpreter each (the
test process's TensorFlow is set up once)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

_PROGRAM = """
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
import mtf_core as mtf
from layout_planner.scale_workers import tensorflow_running
out = {"four": mtf.logical_devices(4), "running": tensorflow_running()}
out["eight"] = mtf.logical_devices(8)  # more, before TensorFlow has run
out["two"] = mtf.logical_devices(2)
out["still"] = tensorflow_running()
with tf.device(out["eight"][7]):
    x = tf.constant(1.0) + 1
out["placed"] = x.device
out["listed"] = [d.name for d in tf.config.list_logical_devices("CPU")]
out["ran"] = tensorflow_running()
try:
    mtf.logical_devices(16)
except mtf.LoweringError as e:
    out["error"] = str(e)
print(json.dumps(out))
"""


def test_logical_devices_are_configured_and_named_before_tensorflow_runs():
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.splitlines()[-1])
    names = [f"/device:CPU:{i}" for i in range(8)]
    assert got["four"] == names[:4] and not got["running"]
    assert got["eight"] == names and got["two"] == names[:2]
    assert not got["still"]
    # The names are TensorFlow's own, and the devices exist once it runs.
    assert got["placed"].endswith("/device:CPU:7")
    assert got["listed"] == names and got["ran"]
    assert got["error"] == (
        "asked for 16 logical CPU devices but TensorFlow was already set up with "
        "8; call logical_cpu_devices before any TF work"
    )

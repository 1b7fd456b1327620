"""Mesh TF's own Transformer package, unchanged, trains and decodes on
mtf_core (examples/mesh_tf_transformer.py, in a subprocess: it installs the
``mesh_tensorflow`` import hook and splits the CPU into 4 devices)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.tf
def test_mesh_tf_lm_trains_equally_under_two_layouts_resumes_and_decodes():
    # gin is the compat extra: `make conformance` installs it and runs this test.
    pytest.importorskip("gin", reason="needs the compat extra (make conformance)")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mesh_tf_transformer.py"), "--steps", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()

    def losses(prefix: str) -> list[float]:
        (line,) = [ln for ln in out if ln.startswith(prefix)]
        values = line.split("[", 1)[1].rstrip("]").split()
        return [float(v) for v in values]

    dp = losses("data-parallel  losses")
    mp = losses("model-parallel losses")
    resumed = losses("data-parallel to step 2, resumed model-parallel")
    assert len(dp) == 4 and dp[-1] < dp[0]  # it learns
    assert mp == pytest.approx(dp, rel=1e-5)  # layouts never change results
    assert resumed == pytest.approx(dp[2:], rel=1e-5)  # a checkpoint moves layouts
    (decoded,) = [ln for ln in out if ln.startswith("decode: ")]
    text = ast.literal_eval(decoded.removeprefix("decode: "))
    assert text.startswith(b"Beautiful ") and len(text) == 16
    (beam,) = [ln for ln in out if ln.startswith("beam search: ")]
    assert len(ast.literal_eval(beam.removeprefix("beam search: "))) == 16
    (planned,) = [ln for ln in out if ln.startswith("auto_layout chose")]
    planned_losses = [float(v) for v in planned.split("[", 1)[1].rstrip("]").split()]
    assert planned_losses == pytest.approx(dp, rel=1e-5)

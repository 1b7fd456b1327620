"""Mesh TF's own BERT (``mesh_tensorflow.bert``), unchanged, pretrains on
mtf_core as its ``run_pretraining.py`` does, in TF1 graph mode
(examples/mesh_tf_bert.py, in a subprocess: it installs the
``mesh_tensorflow`` import hook and splits the CPU into logical devices)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_compat_transformer import _mesh_tf_wheel

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.tf
def test_mesh_tf_bert_pretrains_equally_under_three_layouts():
    _mesh_tf_wheel()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "mesh_tf_bert.py"),
         "--steps", "6", "--devices", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {}
    for line in proc.stdout.splitlines():
        if line.startswith("BERT: "):
            name = line.removeprefix("BERT: ").split(" (")[0]
            values = line.split("losses [")[1].split("]")[0].split()
            runs[name] = [float(v) for v in values]
    assert list(runs) == ["data-parallel", "model-parallel", "2-D b:2;m:2"]
    dp = runs["data-parallel"]
    assert len(dp) == 6
    assert dp[-1] < dp[0] - 0.2  # it learns (each step reads another batch)
    for name, losses in runs.items():
        # layouts never change results, dropout (0.1) included
        assert losses == pytest.approx(dp, rel=1e-5), name

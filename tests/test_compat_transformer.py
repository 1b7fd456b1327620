"""Mesh TF's own Transformer package, unchanged, trains and decodes on
mtf_core (examples/mesh_tf_transformer.py, in a subprocess: it installs the
``mesh_tensorflow`` import hook and splits the CPU into logical devices): a
2-layer LM and a 2-layer T5-shaped bitransformer, configured by Mesh TF's own
gin defaults, on 4 logical CPUs."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from services import service_missing

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _mesh_tf_wheel() -> None:
    """The mesh-tensorflow wheel the example loads Mesh TF's package from:
    fetched once into .cache/conformance (as `make conformance` does).  A
    missing gin (the compat extra) or a wheel that cannot be fetched skips
    the test, or fails it under CI (tests/services.py)."""
    if importlib.util.find_spec("gin") is None:
        service_missing("gin is not installed (the compat extra: make conformance)")
    if os.environ.get("MTF_COMPAT_MESH_TF_PATH"):
        return
    from conformance.run import fetch_wheel

    try:
        fetch_wheel(ROOT / ".cache" / "conformance")
    except subprocess.CalledProcessError as e:
        service_missing(f"cannot fetch the mesh-tensorflow wheel from PyPI: {e}")


def _run_example() -> list[str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    example = ROOT / "examples" / "mesh_tf_transformer.py"
    proc = subprocess.run(
        [sys.executable, str(example), "--steps", "4", "--devices", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def _line(out: list[str], prefix: str) -> str:
    (line,) = [ln for ln in out if ln.startswith(prefix)]
    return line.removeprefix(prefix)


def _losses(out: list[str], prefix: str) -> list[float]:
    values = _line(out, prefix).split("[", 1)[1].rstrip("]").split()
    return [float(v) for v in values]


@pytest.mark.slow
@pytest.mark.tf
def test_mesh_tf_lm_and_bitransformer_train_equally_resume_plan_and_decode():
    _mesh_tf_wheel()
    out = _run_example()
    for model in ("LM", "bitransformer"):
        dp = _losses(out, f"{model}: data-parallel losses")
        mp = _losses(out, f"{model}: model-parallel losses")
        resumed = _losses(
            out, f"{model}: data-parallel to step 2, resumed model-parallel losses"
        )
        assert len(dp) == 4 and dp[-1] < dp[0]  # it learns
        assert mp == pytest.approx(dp, rel=1e-5)  # layouts never change results
        # a checkpoint moves layouts, dropout masks included
        assert resumed == pytest.approx(dp[2:], rel=1e-5)
        (planned,) = [
            ln for ln in out if ln.startswith(f"{model}: auto_layout on b:2;m:2 ")
        ]
        rules = planned.split("chose ", 1)[1].split(" losses")[0]
        assert "batch:b" in ast.literal_eval(rules)  # the planner splits the batch
        assert _losses(out, planned.split("[")[0]) == pytest.approx(dp, rel=1e-5)

    # Mesh TF's LayerStack(recompute_grads=True): each layer through
    # mtf.recompute_grad, its weights made inside, dropout's masks kept; and
    # its ReversibleLayerStack, whose backward pass rebuilds each layer's
    # inputs.  2 layers of self-attention and feed-forward: 4 blocks each,
    # run again in the backward pass.
    dp = _losses(out, "LM: data-parallel losses")
    again = _losses(out, "LM: model-parallel, layers recomputed losses")
    assert again == pytest.approx(dp, rel=1e-5)
    rev = _losses(out, "LM: reversible layers kept losses")
    rev_again = _losses(out, "LM: reversible layers recomputed losses")
    assert rev_again == pytest.approx(rev, rel=1e-5) and rev != dp
    for name in ("layers", "reversible layers"):
        line = _line(out, f"LM: {name} recomputed: ")
        blocks, ops = line.split(" blocks, ops ")
        recomputed, kept = ops.removesuffix(" kept)").split(" (")
        assert int(blocks) == 4 and int(recomputed) > int(kept)

    # Mesh TF's mixture of experts (moe.MoE1D, top-2 gating): the experts
    # split over the devices as the batch is, or not, give the same losses
    # over these 4 steps (later, rounding flips a routing decision)
    moe = _losses(out, "LM: mixture of experts, data-parallel (batch:all) losses")
    split = _losses(
        out, "LM: mixture of experts, experts (batch:all;experts:all) losses"
    )
    assert moe[-1] < moe[0] and split == pytest.approx(moe, rel=1e-5)

    greedy = ast.literal_eval(_line(out, "LM: greedy: "))
    prompts = [b"Beautiful is ", b"Errors should ", b"Now is "]
    assert [g[: len(p)] for g, p in zip(greedy, prompts)] == prompts  # continued
    assert all(len(g) <= 16 for g in greedy)
    assert len(ast.literal_eval(_line(out, "LM: beam search: "))) == 3
    for decoder in ("beam search", "sample"):
        texts = ast.literal_eval(_line(out, f"bitransformer: {decoder}: "))
        assert len(texts) == 3 and all(len(t) <= 16 for t in texts)
    samples = ast.literal_eval(_line(out, "bitransformer: sample: "))
    assert len(set(samples)) > 1  # drawn, not the same text for every prompt


# The names and shapes Mesh TF 0.1.21 itself gives the weights and Adafactor
# slots of examples/mesh_tf_models.py's LM (its defaults.gin, 2 layers of d_model
# 32), built beside it on TensorFlow 2.21.
MESH_TF_LM_VARIABLES = [
    "transformer/embedding [128,32]",
    "transformer/positional_embedding [16,32]",
    "transformer/block_000/layer_000/rms_norm/scale [32]",
    "transformer/block_000/layer_000/SelfAttention/q [32,32]",
    "transformer/block_000/layer_000/SelfAttention/k [32,32]",
    "transformer/block_000/layer_000/SelfAttention/v [32,32]",
    "transformer/block_000/layer_000/SelfAttention/o [32,32]",
    "transformer/block_000/layer_001/rms_norm/scale [32]",
    "transformer/block_000/layer_001/DenseReluDense/wi/kernel [32,64]",
    "transformer/block_000/layer_001/DenseReluDense/wo/kernel [64,32]",
    "transformer/block_001/layer_000/rms_norm/scale [32]",
    "transformer/block_001/layer_000/SelfAttention/q [32,32]",
    "transformer/block_001/layer_000/SelfAttention/k [32,32]",
    "transformer/block_001/layer_000/SelfAttention/v [32,32]",
    "transformer/block_001/layer_000/SelfAttention/o [32,32]",
    "transformer/block_001/layer_001/rms_norm/scale [32]",
    "transformer/block_001/layer_001/DenseReluDense/wi/kernel [32,64]",
    "transformer/block_001/layer_001/DenseReluDense/wo/kernel [64,32]",
    "transformer/rms_norm/scale [32]",
    "transformer/embedding_slot_v [128,32]",
    "transformer/positional_embedding_slot_v [16,32]",
    "transformer/block_000/layer_000/rms_norm/scale_slot_v [32]",
    "transformer/block_000/layer_000/SelfAttention/q_slot_v [32,32]",
    "transformer/block_000/layer_000/SelfAttention/k_slot_v [32,32]",
    "transformer/block_000/layer_000/SelfAttention/v_slot_v [32,32]",
    "transformer/block_000/layer_000/SelfAttention/o_slot_v [32,32]",
    "transformer/block_000/layer_001/rms_norm/scale_slot_v [32]",
    "transformer/block_000/layer_001/DenseReluDense/wi/kernel_slot_v [32,64]",
    "transformer/block_000/layer_001/DenseReluDense/wo/kernel_slot_v [64,32]",
    "transformer/block_001/layer_000/rms_norm/scale_slot_v [32]",
    "transformer/block_001/layer_000/SelfAttention/q_slot_v [32,32]",
    "transformer/block_001/layer_000/SelfAttention/k_slot_v [32,32]",
    "transformer/block_001/layer_000/SelfAttention/v_slot_v [32,32]",
    "transformer/block_001/layer_000/SelfAttention/o_slot_v [32,32]",
    "transformer/block_001/layer_001/rms_norm/scale_slot_v [32]",
    "transformer/block_001/layer_001/DenseReluDense/wi/kernel_slot_v [32,64]",
    "transformer/block_001/layer_001/DenseReluDense/wo/kernel_slot_v [64,32]",
    "transformer/rms_norm/scale_slot_v [32]",
]

_NAMES = """
import sys
sys.path.insert(0, sys.argv[1])
from examples import mesh_tf_models as m
step = m.lm_step(m.load_mesh_tf())
for v in step.graph.all_variables:
    print(v.name, str(v.shape.to_integer_list()).replace(" ", ""))
"""


@pytest.mark.tf
def test_the_lms_weights_and_slots_are_named_as_mesh_tf_names_them():
    """A checkpoint of Mesh TF's Transformer holds these names, so it
    restores by name (but for mtf_core's own step counter,
    docs/compatibility.md "Known gaps"): the dense layers' scopes and
    Adafactor's ``{var}_slot_v`` are Mesh TF's."""
    _mesh_tf_wheel()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-c", _NAMES, str(ROOT)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = proc.stdout.splitlines()
    assert sorted(got) == sorted([*MESH_TF_LM_VARIABLES, "global_step []"])

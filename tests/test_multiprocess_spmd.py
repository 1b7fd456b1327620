"""A mesh across two processes: the Transformer LM trains on ``x:2;y:4`` with
``x`` across processes (4 logical CPUs each) and gives the single-process
losses.

Runs as a script too: ``--task`` trains in a cluster that TF_CONFIG describes
(what the launcher starts), ``--reference`` trains in one process on 8 logical
CPUs under both backends.  Each prints one JSON line.  Collectives that go
wrong poison their process, so everything runs in subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

MESH = "x:2;y:4"
# batch across processes (x), the model inside a process (y): the fast axis
# stays on the host.
RULES = "batch:x;d_ff:y;heads:y;vocab:y"
STEPS = 3
TIMEOUT_S = 420


def _config():
    from mtf_core.models import TransformerConfig

    return TransformerConfig(
        num_layers=1, d_model=16, heads=4, d_kv=4, d_ff=32, vocab=32, length=8, batch=4
    )


def _train(impl_cls, devices) -> dict:
    """STEPS Adam steps of the LM; losses and the full final variables' sums."""
    import mtf_core as mtf
    from mtf_core.models import build_lm

    cfg = _config()
    model = build_lm(cfg, optimizer="adam", learning_rate=1e-2)
    impl = impl_cls(MESH, RULES, devices)
    step = mtf.compile_function(
        model.graph, {model.mesh: impl}, model.placeholders, [model.loss], model.updates
    )
    rng = np.random.RandomState(0)
    tokens = rng.randint(1, cfg.vocab, size=(cfg.batch, cfg.length + 1))
    tokens = tokens.astype(np.int32)
    losses = [float(step(tokens[:, :-1], tokens[:, 1:])[0]) for _ in range(STEPS)]
    values = step.variables.to_dict()  # across processes: collective gathers
    return {
        "losses": losses,
        "variables": {k: float(np.sum(v, dtype=np.float64)) for k, v in values.items()},
        "allreduces": len(step.counters.of_kind("allreduce")),
    }


def _task_main() -> None:
    from mtf_core.lowering import cluster
    from mtf_core.lowering.spmd import SimdMeshImpl

    devices = cluster.initialize_from_env()
    assert devices is not None, "TF_CONFIG is not set"
    spec = cluster.active_cluster()
    impl_probe = SimdMeshImpl(MESH, RULES, devices)
    out = _train(SimdMeshImpl, devices)
    out["task"] = spec.task_index
    out["local_pnums"] = impl_probe.local_pnums
    print(json.dumps(out), flush=True)


def _reference_main() -> None:
    import mtf_core as mtf

    devices = mtf.logical_devices(8)
    out = {
        "placement": _train(mtf.PlacementMeshImpl, devices),
        "spmd": _train(mtf.SimdMeshImpl, devices),
    }
    print(json.dumps(out), flush=True)


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs() -> dict:
    """The 2-process run and the one-process references, side by side."""
    from mtf_core.lowering.launcher import launch

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    ref = subprocess.Popen(
        [sys.executable, __file__, "--reference"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    tasks = launch(
        [sys.executable, __file__, "--task"],
        num_processes=2,
        devices_per_process=4,
        timeout_s=TIMEOUT_S,
        env=env,
    )
    try:
        ref_out, ref_err = ref.communicate(timeout=TIMEOUT_S)
    finally:
        ref.kill()
    for t in tasks:
        assert t.returncode == 0, f"task {t.task} failed:\n{t.stderr[-3000:]}"
    assert ref.returncode == 0, f"reference run failed:\n{ref_err[-3000:]}"
    return {"tasks": [_last_json(t.stdout) for t in tasks], **_last_json(ref_out)}


def test_each_process_runs_the_mesh_devices_of_its_own_host(runs: dict) -> None:
    assert [t["local_pnums"] for t in runs["tasks"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_two_process_lm_losses_equal_the_single_process_runs(runs: dict) -> None:
    one = runs["placement"]["losses"]
    assert one[-1] < one[0]  # it is training
    np.testing.assert_allclose(runs["spmd"]["losses"], one, rtol=1e-5)
    for t in runs["tasks"]:
        np.testing.assert_allclose(t["losses"], one, rtol=1e-5)
    # every process sees exactly the same numbers
    assert runs["tasks"][0]["losses"] == runs["tasks"][1]["losses"]


def test_two_process_variables_gather_to_the_single_process_values(runs: dict) -> None:
    want = runs["placement"]["variables"]
    for t in runs["tasks"]:
        assert t["variables"].keys() == want.keys()
        for name, value in want.items():
            np.testing.assert_allclose(
                t["variables"][name], value, rtol=1e-4, atol=1e-5
            )


def test_two_process_step_records_the_single_process_collectives(runs: dict) -> None:
    n = runs["placement"]["allreduces"]
    assert n > 0
    assert runs["spmd"]["allreduces"] == n
    assert [t["allreduces"] for t in runs["tasks"]] == [n, n]


if __name__ == "__main__":
    if "--task" in sys.argv:
        _task_main()
    elif "--reference" in sys.argv:
        _reference_main()
    else:
        sys.exit(f"usage: {sys.argv[0]} --task | --reference")

"""The SPMD backend gives the placement backend's values and counters.

Collectives that go wrong poison their process (and can hang it), so the
TensorFlow work runs in one subprocess: this file run as a script (8 logical
CPUs) prints one JSON document of measurements, and the tests assert on it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.tf

TIMEOUT_S = 420
MESH = "x:2;y:4"
SHUFFLED = [3, 0, 6, 1, 7, 2, 5, 4]  # devices not in TensorFlow's rank order
SHAPE = "a:4,b:8,c:4"
RULES = "a:x;b:y"
# (name, mesh shape, rules, devices): the four standard layouts, and more
LAYOUTS = [
    ("one_device", "all:1", "", 1),
    ("batch_split", "data:4", "batch:data", 4),
    ("model_split", "model:4", "hidden:model", 4),
    ("split_2d", "data:2;model:4", "batch:data;hidden:model", 8),
]


# -- what the subprocess runs ------------------------------------------------
def _slices(laid: Any) -> np.ndarray:
    return np.stack([np.asarray(s) for s in laid.slices])


def _records(counters: Any) -> list[list[Any]]:
    return [
        [c.kind, list(c.mesh_axes), c.bytes_per_device] for c in counters.collectives
    ]


def _primitive_checks(devices: list[str]) -> dict[str, Any]:
    """Every primitive on both backends (SPMD: all in one traced program)."""
    import tensorflow as tf

    import mtf_core as mtf
    from mtf_core.lowering.counters import Counters
    from mtf_core.lowering.spmd import ReplicaTensor

    place = mtf.PlacementMeshImpl(MESH, RULES, devices)
    spmd = mtf.SimdMeshImpl(MESH, RULES, devices)
    rng = np.random.RandomState(0)
    shape = mtf.convert_to_shape(SHAPE)
    full = tf.constant(rng.randn(4, 8, 4).astype(np.float32))
    flags = tf.constant(rng.rand(4, 8, 4) > 0.5)
    calls = [("import_export", lambda m, x, f: x)]
    for axes in ([0], [1], [0, 1]):
        for red in ("SUM", "MAX", "MIN"):
            calls.append(
                (
                    f"allreduce_{axes}_{red}",
                    lambda m, x, f, a=axes, r=red: m.allreduce(x, a, r),
                )
            )
        for red in ("LOGICAL_OR", "LOGICAL_AND"):
            calls.append(
                (
                    f"allreduce_bool_{axes}_{red}",
                    lambda m, x, f, a=axes, r=red: m.allreduce(f, a, r),
                )
            )
    for mesh_axis, axis in ((0, 0), (1, 1), (0, 2), (1, 2)):
        calls.append(
            (
                f"allconcat_{mesh_axis}_{axis}",
                lambda m, x, f, a=mesh_axis, t=axis: m.allconcat(x, a, t),
            )
        )
    calls.append(("allconcat_bool", lambda m, x, f: m.allconcat(f, 1, 1)))
    for mesh_axis, split, concat in ((0, 2, 0), (1, 2, 1), (1, 2, 0)):
        calls.append(
            (
                f"alltoall_{mesh_axis}_{split}_{concat}",
                lambda m, x, f, a=mesh_axis, s=split, c=concat: m.alltoall(x, a, s, c),
            )
        )
        calls.append(
            (f"allsplit_{mesh_axis}", lambda m, x, f, a=mesh_axis: m.allsplit(x, a, 2))
        )
    for mesh_axis in (0, 1):
        for offset in (1, -1, 2, 5):
            for wrap in (True, False):
                calls.append(
                    (
                        f"shift_{mesh_axis}_{offset}_{wrap}",
                        lambda m, x, f, a=mesh_axis, o=offset, w=wrap: (
                            m.shift_by_n_processors(x, a, o, w)
                        ),
                    )
                )
        calls.append(
            (
                f"pcoordinate_{mesh_axis}",
                lambda m, x, f, a=mesh_axis: m.laid_out_pcoordinate(a),
            )
        )
    calls.append(("pnum", lambda m, x, f: m.laid_out_pnum()))

    place.counters = Counters()
    x_p = place.import_tf_tensor(full, shape)
    f_p = place.import_tf_tensor(flags, shape)
    want = {name: _slices(fn(place, x_p, f_p)) for name, fn in calls}
    place_records = _records(place.counters)
    # reduce_scatter and broadcast have no placement counterpart: their meaning
    want["reduce_scatter_1"] = _slices(place.allsplit(place.allreduce(x_p, [1]), 1, 2))
    bcast = []
    for p in range(8):
        coords = place.pnum_to_processor_coordinates(p)
        coords[1] = 0
        bcast.append(x_p.slices[place.processor_coordinates_to_pnum(coords)].numpy())
    want["broadcast_1"] = np.stack(bcast)

    spmd.counters = Counters()

    def program(x: Any, f: Any) -> tuple[Any, ...]:
        x, f = ReplicaTensor(x), ReplicaTensor(f)
        outs = [fn(spmd, x, f) for _, fn in calls]
        outs.append(spmd.reduce_scatter(x, 1, 2))
        outs.append(spmd.broadcast(x, [1]))
        return tuple(o.tensor for o in outs)

    x_s = spmd.import_tf_tensor(full, shape)
    f_s = spmd.import_tf_tensor(flags, shape)
    per_device = spmd.run_program(program, [x_s, f_s])
    names = [name for name, _ in calls] + ["reduce_scatter_1", "broadcast_1"]
    got = {
        n: np.stack([per_device[p][i] for p in range(8)]) for i, n in enumerate(names)
    }
    spmd_records = _records(spmd.counters)
    return {
        "equal": {n: bool(np.allclose(got[n], want[n], atol=1e-5)) for n in names},
        "placement_records": place_records,
        # reduce_scatter and broadcast are recorded last, after placement's
        "spmd_records": spmd_records[:-2],
        "spmd_extra_records": spmd_records[-2:],
        "export": bool(
            np.array_equal(spmd.export_to_tf_tensor(x_s, shape).numpy(), full.numpy())
        ),
    }


def _mlp(mtf: Any):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch, rows = mtf.Dimension("batch", 8), mtf.Dimension("rows", 6)
    hidden, classes = mtf.Dimension("hidden", 16), mtf.Dimension("classes", 4)
    x = mtf.placeholder(mesh, [batch, rows])
    w1 = mtf.get_variable(mesh, "w1", [rows, hidden])
    w2 = mtf.get_variable(mesh, "w2", [hidden, classes])
    h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]))
    logits = mtf.einsum([h, w2], output_shape=[batch, classes])
    loss = mtf.reduce_mean(mtf.reduce_logsumexp(logits, "classes"))
    g1, g2 = mtf.gradients([loss], [w1, w2])
    updates = [mtf.assign(w1, w1 - g1 * 0.5), mtf.assign(w2, w2 - g2 * 0.5)]
    return graph, mesh, x, loss, logits, updates


def _training_checks(devices: list[str]) -> dict[str, Any]:
    """The MLP's SGD steps under each layout, on both backends."""
    import mtf_core as mtf

    xv = np.random.RandomState(1).randn(8, 6).astype(np.float32)
    out: dict[str, Any] = {}
    for name, mesh_shape, rules, n in LAYOUTS:
        for backend in ("placement", "spmd"):
            graph, mesh, x, loss, logits, updates = _mlp(mtf)
            cls = mtf.PlacementMeshImpl if backend == "placement" else mtf.SimdMeshImpl
            step = mtf.compile_function(
                graph,
                {mesh: cls(mesh_shape, rules, devices[:n])},
                [x],
                [loss, logits],
                updates,
            )
            runs = [step(xv) for _ in range(3)]
            out[f"{name}/{backend}"] = {
                "losses": [float(r[0]) for r in runs],
                "logits": runs[-1][1].tolist(),
                "variables": {
                    k: v.tolist() for k, v in step.variables.to_dict().items()
                },
                "records": _records(step.counters),
                "flops": step.counters["flops_per_device"],
                "type": type(step).__name__,
            }
    return out


def _trace_once_checks(devices: list[str]) -> dict[str, Any]:
    """Traced graph sizes of the data-parallel MLP on 2, 4 and 8 devices."""
    import mtf_core as mtf

    sizes: dict[str, Any] = {"spmd_program": {}, "spmd_launcher": {}, "placement": {}}
    for n in (2, 4, 8):
        for backend in ("placement", "spmd"):
            graph, mesh, x, loss, _, updates = _mlp(mtf)
            cls = mtf.PlacementMeshImpl if backend == "placement" else mtf.SimdMeshImpl
            step = mtf.compile_function(
                graph,
                {mesh: cls(f"all:{n}", "batch:all", devices[:n])},
                [x],
                [loss],
                updates,
            )
            step.trace()
            if backend == "spmd":
                sizes["spmd_program"][n] = step.replica_graph_nodes
                sizes["spmd_launcher"][n] = step.launcher_graph_nodes
            else:
                sizes["placement"][n] = len(step.concrete.graph.as_graph_def().node)
    return sizes


def _checkpoint_checks(devices: list[str]) -> dict[str, Any]:
    """Placement trains 2 steps and saves; SPMD (another layout) resumes."""
    import mtf_core as mtf

    xv = np.random.RandomState(2).randn(8, 6).astype(np.float32)
    losses = {}
    for backend, mesh_shape, rules in (
        ("placement", "data:2;model:4", "batch:data;hidden:model"),
        ("spmd", "model:8", "hidden:model"),
    ):
        graph, mesh, x, loss, _, updates = _mlp(mtf)
        cls = mtf.PlacementMeshImpl if backend == "placement" else mtf.SimdMeshImpl
        step = mtf.compile_function(
            graph, {mesh: cls(mesh_shape, rules, devices)}, [x], [loss], updates
        )
        if backend == "placement":
            losses["before"] = [float(step(xv)[0]) for _ in range(2)]
            saved = step.variables.to_dict()
            losses["placement_next"] = float(step(xv)[0])
        else:
            step.variables.load_dict(saved)
            losses["spmd_next"] = float(step(xv)[0])
    return losses


def _main() -> None:
    import mtf_core as mtf

    devices = mtf.logical_devices(8)
    shuffled = [devices[i] for i in SHUFFLED]
    results = {
        "primitives": _primitive_checks(devices),
        "primitives_shuffled": _primitive_checks(shuffled),
        "training": _training_checks(devices),
        "trace_once": _trace_once_checks(devices),
        "checkpoint": _checkpoint_checks(devices),
    }
    print(json.dumps(results), flush=True)


def _timeout_main() -> None:
    """A peer that never comes: with a collective timeout the wait ends in an
    error instead of hanging (the process is poisoned afterwards)."""
    import tensorflow as tf

    import mtf_core as mtf

    devices = mtf.logical_devices(2)
    impl = mtf.SimdMeshImpl("x:2", "a:x", devices, collective_timeout_s=2)
    laid = impl.import_tf_tensor(tf.ones([4]), "a:4")
    impl.local_pnums = [0]  # as if device 1 were another process that died
    t0 = time.perf_counter()
    try:
        impl.allreduce(laid, [0])
        outcome = "returned"
    except tf.errors.DeadlineExceededError:
        outcome = "DeadlineExceededError"
    print(json.dumps({"outcome": outcome, "seconds": time.perf_counter() - t0}))


# -- the tests ---------------------------------------------------------------
@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run(
        [sys.executable, __file__],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("order", ["primitives", "primitives_shuffled"])
def test_every_primitive_gives_the_placement_slices(results: dict, order: str) -> None:
    equal = results[order]["equal"]
    assert len(equal) > 40
    assert [n for n, ok in equal.items() if not ok] == []
    assert results[order]["export"]


@pytest.mark.parametrize("order", ["primitives", "primitives_shuffled"])
def test_every_primitive_records_what_placement_records(
    results: dict, order: str
) -> None:
    got = results[order]
    assert got["spmd_records"] == got["placement_records"]
    kinds = {r[0] for r in got["placement_records"]}
    assert kinds == {"allreduce", "allconcat", "alltoall", "shift"}


def test_reduce_scatter_and_broadcast_record_their_slice_bytes(results: dict) -> None:
    # a [2, 2, 4] float32 slice is 64 bytes; both run over mesh axis y
    assert results["primitives"]["spmd_extra_records"] == [
        ["reducescatter", ["y"], 64],
        ["broadcast", ["y"], 64],
    ]


@pytest.mark.parametrize("layout", [c[0] for c in LAYOUTS])
def test_compiled_training_equals_placement_under_each_layout(
    results: dict, layout: str
) -> None:
    place = results["training"][f"{layout}/placement"]
    spmd = results["training"][f"{layout}/spmd"]
    assert spmd["type"] == "SpmdCompiledFunction"
    assert place["losses"][-1] < place["losses"][0]
    np.testing.assert_allclose(spmd["losses"], place["losses"], rtol=1e-5)
    np.testing.assert_allclose(spmd["logits"], place["logits"], rtol=1e-5, atol=1e-6)
    for name, value in place["variables"].items():
        np.testing.assert_allclose(spmd["variables"][name], value, rtol=1e-5, atol=1e-6)


def test_training_losses_do_not_depend_on_layout_on_the_spmd_backend(
    results: dict,
) -> None:
    one = results["training"]["one_device/spmd"]["losses"]
    for layout, *_ in LAYOUTS[1:]:
        np.testing.assert_allclose(
            results["training"][f"{layout}/spmd"]["losses"], one, rtol=1e-5
        )


@pytest.mark.parametrize("layout", [c[0] for c in LAYOUTS])
def test_compiled_step_records_the_placement_collectives_and_flops(
    results: dict, layout: str
) -> None:
    place = results["training"][f"{layout}/placement"]
    spmd = results["training"][f"{layout}/spmd"]
    assert spmd["records"] == place["records"]
    assert spmd["flops"] == place["flops"]


def test_split_2d_step_allreduces_over_both_axes(results: dict) -> None:
    records = results["training"]["split_2d/spmd"]["records"]
    axes = {tuple(r[1]) for r in records if r[0] == "allreduce"}
    assert axes == {("data",), ("model",)}


def test_spmd_program_size_does_not_grow_with_the_number_of_devices(
    results: dict,
) -> None:
    sizes = results["trace_once"]
    program = sizes["spmd_program"]
    assert program["2"] == program["4"] == program["8"]
    # the launcher adds one call (and its variable handles) per device
    launcher = sizes["spmd_launcher"]
    assert launcher["2"] < launcher["4"] < launcher["8"]
    # placement copies every op onto every device
    placement = sizes["placement"]
    assert placement["8"] > 3 * placement["2"] > 0
    assert program["8"] < placement["8"]


def test_spmd_step_resumes_a_placement_checkpoint_under_another_layout(
    results: dict,
) -> None:
    got = results["checkpoint"]
    np.testing.assert_allclose(got["spmd_next"], got["placement_next"], rtol=1e-5)


def test_a_peer_that_never_comes_raises_after_the_collective_timeout() -> None:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run(
        [sys.executable, __file__, "--timeout"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["outcome"] == "DeadlineExceededError"
    assert got["seconds"] >= 2


if __name__ == "__main__":
    _timeout_main() if "--timeout" in sys.argv else _main()

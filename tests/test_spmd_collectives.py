"""SPMD plumbing that runs no collective: keys, ranks, dtypes, cluster specs,
the launcher and the backend's errors (in-process; collectives run in
test_spmd_backend.py's subprocess)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import tensorflow as tf

import mtf_core as mtf
from mtf_core.errors import LoweringError
from mtf_core.lowering import spmd_collectives as coll
from mtf_core.lowering.cluster import ClusterSpec, cluster_devices
from mtf_core.lowering.launcher import launch, local_cluster
from mtf_core.lowering.spmd import SimdMeshImpl
from mtf_core.lowering.spmd_compiled import SpmdCompiledFunction


def _cpus(n: int, task: int | None = None) -> list[str]:
    prefix = "" if task is None else f"/job:worker/replica:0/task:{task}"
    return [f"{prefix}/device:CPU:{i}" for i in range(n)]


# -- keys ---------------------------------------------------------------------
def test_group_key_names_the_device_set_whatever_its_order() -> None:
    devs = [coll.full_device_name(coll.parse_device(d)) for d in _cpus(4)]
    assert coll.group_key(devs) == coll.group_key(devs[::-1])
    assert coll.group_key(devs[:2]) != coll.group_key(devs[2:])


def test_group_key_collision_is_an_error_not_a_hang(monkeypatch) -> None:
    devs = ["/job:localhost/replica:0/task:0/device:CPU:0"]
    key = coll.group_key(devs)
    monkeypatch.setitem(coll._group_members, key, ("/some/other:device",))
    with pytest.raises(LoweringError, match=f"group key {key}"):
        coll.group_key(devs)


def test_instance_keys_are_fresh_per_call_site() -> None:
    keys = [coll.next_instance_key() for _ in range(3)]
    assert keys == sorted(set(keys))


# -- device names and ranks -----------------------------------------------------
def test_bare_device_names_mean_this_task() -> None:
    assert coll.parse_device("/device:CPU:3") == ("localhost", 0, 0, "CPU", 3)
    assert coll.parse_device("/cpu:1", "worker", 2) == ("worker", 0, 2, "CPU", 1)
    full = "/job:worker/replica:0/task:1/device:GPU:2"
    assert coll.full_device_name(coll.parse_device(full)) == full


@pytest.mark.parametrize("name", ["", "/job:worker", "not a device"])
def test_names_that_are_not_devices_are_rejected(name: str) -> None:
    with pytest.raises(LoweringError, match="device"):
        coll.parse_device(name)


def test_ranks_follow_tensorflow_order_not_the_mesh_order() -> None:
    # CPU:10 ranks after CPU:9 (TensorFlow compares parsed names) ...
    keys = [coll.parse_device(d) for d in _cpus(12)]
    assert sorted(range(12), key=lambda p: keys[p]) == list(range(12))
    # ... and task 0's devices before task 1's, whatever the mesh order
    two_tasks = _cpus(2, task=1) + _cpus(2, task=0)
    groups = coll.AxisGroups.build(
        [[0, 1, 2, 3]],
        [coll.full_device_name(coll.parse_device(d)) for d in two_tasks],
        [coll.parse_device(d) for d in two_tasks],
        [0],
    )
    assert groups.coord_to_rank[0] == (2, 3, 0, 1)
    assert groups.rank_to_coord[0] == (2, 3, 0, 1)
    assert not groups.identity_ranks


def test_axis_groups_give_each_pnum_its_group_key_and_position() -> None:
    impl = SimdMeshImpl("x:2;y:4", "", _cpus(8)[::-1])
    rows = impl.axis_groups([1])  # groups along y: pnums 0-3 and 4-7
    assert rows.group_size == 4
    assert len(set(rows.group_keys[:4])) == 1 and len(set(rows.group_keys[4:])) == 1
    assert rows.group_keys[0] != rows.group_keys[4]
    assert rows.position == (0, 1, 2, 3, 0, 1, 2, 3)
    # reversed devices: coordinate k holds the (n-1-k)-th device in rank order
    assert rows.coord_to_rank[0] == (3, 2, 1, 0)
    assert not rows.identity_ranks
    everything = impl.axis_groups([0, 1])
    assert everything.single_group and everything.group_size == 8


# -- dtypes -----------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype, kind, carrier",
    [
        (tf.float32, "allgather", tf.float32),
        (tf.int64, "allreduce", tf.int64),
        (tf.bool, "allreduce", tf.int32),
        (tf.int8, "alltoall", tf.int32),
        (tf.bfloat16, "allreduce", tf.bfloat16),
        (tf.bfloat16, "allgather", tf.float16),  # bitcast: its own 2 bytes
        (tf.bfloat16, "broadcast", tf.float16),
        (tf.int16, "allreduce", tf.int32),  # summed: widened
    ],
)
def test_dtypes_travel_in_a_carrier_the_cpu_kernels_take(dtype, kind, carrier) -> None:
    assert coll.carrier_dtype(dtype, kind) == carrier


def test_a_dtype_no_collective_can_carry_is_named_in_the_error() -> None:
    with pytest.raises(LoweringError, match="complex64"):
        coll.carrier_dtype(tf.complex64, "allreduce")


def test_unknown_reduction_is_rejected_before_any_collective() -> None:
    ch = coll.Channel(2, 1, None)
    with pytest.raises(LoweringError, match="PROD"):
        coll.all_reduce(None, ch, "PROD")


# -- cluster specs and the launcher --------------------------------------------
def test_tf_config_round_trips_and_lists_devices_task_by_task() -> None:
    spec = ClusterSpec.from_tf_config(
        {"cluster": {"worker": ["h0:2222", "h1:2222"]}, "task": {"index": 1}}
    )
    assert spec == ClusterSpec(("h0:2222", "h1:2222"), 1, "worker")
    assert ClusterSpec.from_tf_config(spec.to_tf_config()) == spec
    assert cluster_devices(spec, 2) == [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:1",
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:1",
    ]


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ("not json", "not a JSON object"),
        ({"cluster": {"worker": ["h:1"]}}, "'task'"),
        ({"cluster": {"chief": ["h:1"], "worker": ["h:2"]}, "task": {}}, "one job"),
        ({"cluster": {"worker": ["h:1"]}, "task": {"index": 3}}, "task index 3"),
        ({"cluster": {"worker": ["nohost"]}, "task": {}}, "'nohost'"),
        ({"cluster": {"worker": ["h:1"]}, "task": {"type": "ps"}}, "'ps'"),
    ],
)
def test_bad_tf_config_says_what_is_wrong(tf_config, message: str) -> None:
    with pytest.raises(LoweringError, match=message):
        ClusterSpec.from_tf_config(tf_config)


def test_local_cluster_gives_each_task_its_own_loopback_port() -> None:
    specs = local_cluster(3)
    assert [s.task_index for s in specs] == [0, 1, 2]
    assert len(set(specs[0].addresses)) == 3
    assert all(s.addresses == specs[0].addresses for s in specs)


def test_launcher_hands_each_process_its_task() -> None:
    code = (
        "import json, os; c = json.loads(os.environ['TF_CONFIG']); "
        "print(c['task']['index'], os.environ['MTF_DEVICES_PER_PROCESS'])"
    )
    results = launch([sys.executable, "-c", code], 2, 4, timeout_s=60)
    assert [r.returncode for r in results] == [0, 0]
    assert [r.stdout.split() for r in results] == [["0", "4"], ["1", "4"]]


def test_launcher_stops_the_others_when_one_process_fails() -> None:
    code = (
        "import json, os, sys, time; c = json.loads(os.environ['TF_CONFIG']); "
        "sys.exit(3) if c['task']['index'] == 0 else time.sleep(120)"
    )
    results = launch([sys.executable, "-c", code], 2, 1, timeout_s=100)
    assert results[0].returncode == 3
    assert results[1].returncode < 0  # killed, not left waiting


# -- the backend's errors -----------------------------------------------------
def test_device_list_must_match_the_mesh() -> None:
    with pytest.raises(LoweringError, match="4 processors but 3 devices"):
        SimdMeshImpl("x:4", "", _cpus(3))
    with pytest.raises(LoweringError, match="twice"):
        SimdMeshImpl("x:2", "", ["/device:CPU:0", "/cpu:0"])


def test_a_mesh_with_no_device_in_this_process_is_rejected() -> None:
    with pytest.raises(LoweringError, match="belongs to this process"):
        SimdMeshImpl("x:2", "", _cpus(2, task=1))


def test_only_this_process_devices_are_local() -> None:
    impl = SimdMeshImpl("x:2;y:2", "", _cpus(2) + _cpus(2, task=1))
    assert impl.local_pnums == [0, 1]
    assert not impl.all_local


@pytest.mark.tf
def test_spmd_step_needs_one_mesh_on_the_spmd_backend(devices: list[str]) -> None:
    graph = mtf.Graph()
    a, b = mtf.Mesh(graph, "a"), mtf.Mesh(graph, "b")
    x = mtf.placeholder(a, "batch:4")
    y = mtf.placeholder(b, "batch:4")
    impls = {
        a: SimdMeshImpl("m:2", "batch:m", devices[:2]),
        b: mtf.PlacementMeshImpl("m:2", "batch:m", devices[2:4]),
    }
    with pytest.raises(LoweringError, match="one SimdMeshImpl"):
        mtf.compile_function(graph, impls, [x, y], [x, y])


@pytest.mark.tf
def test_variables_of_another_backend_are_rejected(devices: list[str]) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    w = mtf.get_variable(mesh, "w", "batch:4")
    placed = mtf.VariableStore(
        graph, {mesh: mtf.PlacementMeshImpl("m:2", "batch:m", devices[:2])}
    )
    impl = SimdMeshImpl("m:2", "batch:m", devices[:2])
    with pytest.raises(LoweringError, match="not SPMD variable slices"):
        impl.read_variables(placed.slices(w))


@pytest.mark.tf
def test_variable_slices_live_on_their_devices_under_one_name(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    w = mtf.get_variable(mesh, "w", "batch:4", initializer=tf.keras.initializers.Ones())
    impl = SimdMeshImpl("m:2", "batch:m", devices[:2])
    slices = mtf.VariableStore(graph, {mesh: impl}).slices(w)
    assert slices[0].shared_name == slices[1].shared_name
    assert slices[0].shared_name.endswith("/w")
    assert [s.device for s in slices] == impl.devices
    slices[1].assign_add(np.ones(2, np.float32))
    np.testing.assert_array_equal(slices[0].numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(slices[1].numpy(), [2.0, 2.0])


@pytest.mark.tf
def test_eager_import_and_export_round_trip_without_collectives(
    devices: list[str],
) -> None:
    impl = SimdMeshImpl("x:2;y:4", "a:x;b:y", devices)
    full = np.arange(64, dtype=np.float32).reshape(4, 16)
    laid = impl.import_tf_tensor(full, "a:4,b:16")
    assert [s.shape.as_list() for s in laid.slices] == [[2, 4]] * 8
    np.testing.assert_array_equal(laid.slices[5].numpy(), full[2:4, 4:8])
    np.testing.assert_array_equal(impl.export_to_tf_tensor(laid, "a:4,b:16"), full)


@pytest.mark.tf
def test_compile_function_takes_the_spmd_path_for_the_spmd_backend(
    devices: list[str],
) -> None:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.placeholder(mesh, "batch:4")
    step = mtf.compile_function(
        graph, {mesh: SimdMeshImpl("m:2", "batch:m", devices[:2])}, [x], [x]
    )
    assert isinstance(step, SpmdCompiledFunction)
    with pytest.raises(LoweringError, match="takes 1 inputs"):
        step()

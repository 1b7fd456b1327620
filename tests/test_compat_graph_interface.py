"""``mesh_tensorflow.auto_mtf.graph_interface`` on TF graphs and mtf graphs,
and the ``CostGraphDef`` protobuf it makes for Mesh TF's scheduler."""

from __future__ import annotations

import pytest
import tensorflow as tf

import mtf_core as mtf
from mtf_core.compat.auto_mtf import graph_interface, scheduler
from mtf_core.errors import GraphError

pytestmark = pytest.mark.tf


def _tf_graph() -> tf.Graph:
    g = tf.Graph()
    with g.as_default():
        with tf.device("/device:CPU:0"):
            x = tf.zeros([3, 4], dtype=tf.int32, name="X")
            y = tf.zeros([4, 5], dtype=tf.int32, name="Y")
        with tf.device("/device:CPU:1"):
            tf.matmul(x, y, name="Z1")
        tf.matmul(x, y, name="Z2")
    return g


def test_tf_graph_names_devices_and_sizes() -> None:
    gi = graph_interface.GraphInterface(_tf_graph(), canonical_device="/device:CPU:0")
    assert list(gi.get_all_operation_names()) == ["X", "Y", "Z1", "Z2"]
    assert list(gi.get_operation_input_names("Z1")) == ["X:0", "Y:0"]
    assert gi.get_tensor_dtype("Z1:0") == tf.int32
    assert gi.get_tensor_shape("Z1:0") == [3, 5]
    assert gi.get_tensor_size("Y:0") == 80  # 20 int32s
    assert gi.get_tensor_mtf_dimension_names("X:0") == []
    assert gi.get_operation_mtf_dimension_names("Z1") == set()
    assert gi.get_tensor_device("Z1:0") == "/device:CPU:1"
    assert gi.get_tensor_device("Z2:0") == ""
    assert gi.is_tensor_on_canonical_device("X:0")
    assert not gi.is_tensor_on_canonical_device("Z1:0")
    assert gi.is_tensor_on_canonical_device("Z2:0")  # no device: everywhere


def test_tf_graph_cost_graph_counts_only_the_listed_devices() -> None:
    gi = graph_interface.GraphInterface(_tf_graph())
    gi.set_tensor_final("Z2:0")
    full = gi.compute_cost_graph()
    assert [n.name for n in full.node] == ["X", "Y", "Z1", "Z2"]
    assert [n.id for n in full.node] == [0, 1, 2, 3]
    assert [n.device for n in full.node] == [
        "/device:CPU:0", "/device:CPU:0", "/device:CPU:1", "",
    ]  # fmt: skip
    z1 = full.node[2]
    assert [(i.preceding_node, i.preceding_port) for i in z1.input_info] == [
        (0, 0), (1, 0),
    ]  # fmt: skip
    assert [o.size for n in full.node for o in n.output_info] == [48, 80, 60, 60]
    assert [d.size for d in z1.output_info[0].shape.dim] == [3, 5]
    assert z1.output_info[0].dtype == tf.int32.as_datatype_enum
    assert z1.output_info[0].alias_input_port == -1
    assert [n.is_final for n in full.node] == [False, False, False, True]
    only_cpu0 = gi.compute_cost_graph(devices=["/device:CPU:0"])
    sizes = [o.size for n in only_cpu0.node for o in n.output_info]
    assert sizes == [48, 80, 0, 0]
    assert not only_cpu0.node[2].output_info[0].HasField("shape")


def test_mtf_graph_cost_graph_has_no_devices() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.Constant(m, 0, "a:3,b:4", "int32", name="X").outputs[0]
    y = mtf.Constant(m, 0, "b:4,c:5", "float32", name="Y").outputs[0]
    z = mtf.einsum([mtf.cast(x, "float32"), y], output_shape="a:3,c:5", name="Z")
    gi = graph_interface.GraphInterface(g)
    gi.set_tensor_final(z.name)
    proto = gi.compute_cost_graph(devices=[])  # no devices: mtf tensors keep sizes
    assert [n.name for n in proto.node] == ["X", "Y", "cast", "Z"]
    assert all(
        not n.HasField("device") if False else n.device == "" for n in proto.node
    )
    assert [o.size for n in proto.node for o in n.output_info] == [48, 80, 48, 60]
    assert proto.node[1].output_info[0].dtype == tf.float32.as_datatype_enum
    assert [(i.preceding_node, i.preceding_port) for i in proto.node[3].input_info] == [
        (2, 0), (1, 0),
    ]  # fmt: skip
    assert [n.is_final for n in proto.node] == [False, False, False, True]
    assert gi.get_operation_device("Z") is None


def test_scheduler_reads_a_tf_graph() -> None:
    gi = graph_interface.GraphInterface(_tf_graph())
    # X (48 bytes) before Y (80); Z1/Z2 tie on what they free: by name.
    assert list(scheduler.minimize_peak_memory(gi, "LIST")) == [0, 1, 2, 3]


def test_tf_tensor_of_unknown_shape_has_no_size() -> None:
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.placeholder(tf.float32, [None, 3], name="P")
    gi = graph_interface.GraphInterface(g)
    with pytest.raises(GraphError, match=r"'P:0' has shape \(None, 3\)"):
        gi.get_tensor_size("P:0")

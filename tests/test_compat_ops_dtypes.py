"""Mixed-precision variables (Mesh TensorFlow's ``VariableDType``): what is
stored, what the model computes in, what gradients, assignments, checkpoints,
collectives and the memory model see; and the dtype helpers."""

from __future__ import annotations

import numpy as np
import pytest

import mtf_core as mtf
from cost_models import memory_model
from cost_models.memory import ACTIVATION, PARAM
from mtf_core.ops.variables import as_variable

MIXED = mtf.VariableDType("float32", "float32", "bfloat16")


def test_variable_dtype_defaults_to_the_master_dtype_and_canonicalizes_names() -> None:
    vd = mtf.VariableDType(mtf.bfloat16)
    assert (vd.master_dtype, vd.slice_dtype, vd.activation_dtype) == ("bfloat16",) * 3
    assert MIXED == mtf.VariableDType(activation_dtype="bfloat16")
    assert hash(MIXED) == hash(mtf.VariableDType(activation_dtype="bfloat16"))
    with pytest.raises(mtf.DTypeError, match="float31"):
        mtf.VariableDType("float31")


def test_get_variable_returns_the_activation_dtype_and_stores_the_slice_dtype() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    w = mtf.get_variable(m, "w", "d:4,h:8", MIXED)
    var = as_variable(w)
    assert w.dtype == "bfloat16"
    assert (var.dtype, var.master_dtype, var.activation_dtype) == (
        "float32",
        "float32",
        "bfloat16",
    )
    # Mesh TensorFlow's deprecated separate dtypes override a plain dtype
    u = mtf.get_variable(m, "u", "d:4", mtf.float32, activation_dtype=mtf.bfloat16)
    assert u.dtype == "bfloat16" and as_variable(u).slice_dtype == "float32"
    # a plain dtype is all three; the value is the variable's own tensor
    p = mtf.get_variable(m, "p", "d:4", mtf.bfloat16)
    assert p.operation is as_variable(p) and p.dtype == "bfloat16"
    # assignments reach the variable through the cast, in its stored dtype
    a = mtf.assign(w, w * 2.0)
    assert a.variable is var and a.inputs[1].dtype == "float32"
    with pytest.raises(
        mtf.ArgumentError, match="unknown arguments \\['partitioner'\\]"
    ):
        mtf.get_variable(m, "q", "d:4", partitioner=None)


def test_memory_model_counts_stored_params_and_bf16_reads_by_their_dtypes() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    w = mtf.get_variable(m, "w", "d:4,h:8", MIXED)
    x = mtf.zeros(m, "b:2,d:4", dtype=mtf.bfloat16)
    y = mtf.einsum([x, w], output_shape="b:2,h:8")
    mm = memory_model(g, [y])
    kinds = {t.name.split(":")[0]: (t.kind, t.bytes) for t in mm.tensors}
    assert kinds["w"] == (PARAM, 4 * 8 * 4)  # float32 master/slices
    assert kinds["w/read"] == (ACTIVATION, 4 * 8 * 2)  # bfloat16 activations
    assert kinds[y.operation.name] == (ACTIVATION, 2 * 8 * 2)


@pytest.mark.tf
def test_bf16_training_on_cpu_keeps_float32_weights_and_bf16_collectives(
    devices: list[str],
) -> None:
    import tensorflow as tf

    def build():
        g = mtf.Graph()
        m = mtf.Mesh(g, "m")
        x = mtf.placeholder(m, "batch:8,d:4", dtype=mtf.bfloat16)
        w = mtf.get_variable(
            m, "w", "d:4,h:8", MIXED, initializer=lambda s, d: np.full(s, 0.5)
        )
        y = mtf.einsum([x, w], output_shape="batch:8,h:8")
        loss = mtf.reduce_sum(mtf.square(mtf.to_float(y)))
        var = as_variable(w)
        (grad,) = mtf.gradients([loss], [var.outputs[0]])
        assert grad.dtype == "float32"
        upd = mtf.assign(w, var.outputs[0] - grad * 0.01)
        return g, m, x, var, loss, upd

    xv = tf.cast(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4), tf.bfloat16)
    results = {}
    for rules in ("", "batch:all", "h:all"):
        g, m, x, var, loss, upd = build()
        impl = mtf.PlacementMeshImpl("all:4", rules, devices[:4])
        step = mtf.compile_function(
            g, {m: impl}, inputs=[x], outputs=[loss], updates=[upd]
        )
        losses = [float(step(xv)[0]) for _ in range(3)]
        exported = step.variables.export(var)
        assert exported.dtype == np.float32  # the master dtype
        specs = [
            (c.kind, c.mesh_axes, c.bytes_per_device) for c in step.counters.collectives
        ]
        results[rules] = (losses, exported, specs)
    ref_losses, ref_w, _ = results[""]
    assert ref_losses[1] < ref_losses[0]
    for rules in ("batch:all", "h:all"):
        np.testing.assert_allclose(results[rules][0], ref_losses, rtol=2e-2)
        np.testing.assert_allclose(results[rules][1], ref_w, rtol=2e-2, atol=1e-3)
    # Data parallel: the weight gradient is summed in bf16 (4*8 elements x 2 B),
    # the loss in float32 (4 B).
    assert sorted(results["batch:all"][2]) == [
        ("allreduce", ("all",), 4),
        ("allreduce", ("all",), 64),
    ]
    # the stored weights moved by float32 updates smaller than a bf16 ulp at 0.5
    assert not np.all(ref_w == 0.5)


def test_dtype_helpers_cast() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.zeros(m, "a:2", dtype=mtf.int32)
    assert mtf.to_float(x).dtype == "float32"
    assert mtf.to_bfloat16(x).dtype == "bfloat16"
    assert mtf.to_int32(mtf.to_float(x)).dtype == "int32"
    assert mtf.to_int32(x) is x


def test_get_variable_returns_the_variable_of_an_existing_name() -> None:
    from mtf_core.ops.variables import set_variable_scope_provider

    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    w = mtf.get_variable(m, "w", "d:4,h:8")
    again = mtf.get_variable(m, "w", "d:4,h:8", activation_dtype=mtf.bfloat16)
    assert as_variable(again) is as_variable(w) and again.dtype == "bfloat16"
    assert len(g.all_variables) == 1
    with pytest.raises(
        mtf.ShapeError, match="'w': the graph's variable .*\\[d:4,h:8\\]"
    ):
        mtf.get_variable(m, "w", "d:4")
    # a scope provider (Mesh TF's tf.variable_scope) prefixes the names
    scope = ["enc"]
    set_variable_scope_provider(lambda: scope[0])
    try:
        a = mtf.get_variable(m, "w", "d:4")
        scope[0] = "dec"
        b = mtf.get_variable(m, "w", "d:4")
    finally:
        set_variable_scope_provider(None)
    assert [v.name for v in g.all_variables] == ["w", "enc/w", "dec/w"]
    assert as_variable(a) is not as_variable(b)

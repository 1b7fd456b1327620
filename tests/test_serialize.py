"""Graph serialization: round trips, the builder registry, and that a rebuilt
graph lowers to the same values as the original.  Bad documents and limits are
in test_serialize_errors.py."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from serialize_cases import (
    BATCH,
    GRAPHS,
    HIDDEN,
    ROWS,
    build_mlp,
    comparable_attrs,
    round_trip,
    small_doc,
)

import mtf_core as mtf
from mtf_core.comm import LayoutContext
from mtf_core.errors import SerializationError
from mtf_core.serialization import (
    FORMAT_NAME,
    FORMAT_VERSION,
    register,
    registered_op_types,
)

# -- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("which", sorted(GRAPHS))
def test_round_trip_keeps_op_types_names_shapes_dtypes_flops_and_splittability(
    which: str,
) -> None:
    b = GRAPHS[which]()
    loaded = round_trip(b, check_derived=True)
    before, after = b.graph.operations, loaded.graph.operations
    assert [type(op) for op in after] == [type(op) for op in before]
    assert [op.op_type for op in after] == [op.op_type for op in before]
    assert [op.name for op in after] == [op.name for op in before]
    for o, r in zip(before, after):
        assert [t.name for t in r.inputs] == [t.name for t in o.inputs], o.name
        assert [(t.shape, t.dtype) for t in r.outputs] == [
            (t.shape, t.dtype) for t in o.outputs
        ], o.name
        assert r.flops() == o.flops(), o.name
        assert r.splittable_dims() == o.splittable_dims(), o.name
        assert r.unsplittable_dims() == o.unsplittable_dims(), o.name
        assert comparable_attrs(r) == comparable_attrs(o), o.name
        assert r.mesh is loaded.meshes["m"]
    assert [t.name for t in loaded.outputs] == [t.name for t in b.outputs]
    assert [v.name for v in loaded.graph.all_variables] == [
        v.name for v in b.graph.all_variables
    ]
    assert [v.name for v in loaded.graph.trainable_variables] == [
        v.name for v in b.graph.trainable_variables
    ]


@pytest.mark.parametrize("which", sorted(GRAPHS))
def test_serializing_a_rebuilt_graph_gives_the_same_document(which: str) -> None:
    b = GRAPHS[which]()
    doc = mtf.graph_to_dict(b.graph, outputs=b.outputs, metadata={"model": which})
    loaded = mtf.graph_from_dict(json.loads(json.dumps(doc)))
    again = mtf.graph_to_dict(loaded.graph, loaded.outputs, loaded.metadata)
    # Only what is documented as not preserved may differ.
    for op in doc["operations"]:
        if op["op_type"] == "ImportTensor":
            op["attrs"]["placeholder"] = True
        if op["op_type"] == "Variable":
            op["attrs"]["initializer"] = None
    assert again == doc
    assert again["format"] == FORMAT_NAME and again["version"] == FORMAT_VERSION
    assert again["metadata"] == {"model": which}


def test_document_lists_variables_outputs_and_each_ops_splittability_and_flops() -> (
    None
):
    b = build_mlp()
    doc = mtf.graph_to_dict(b.graph, outputs=b.outputs)
    assert doc["variables"] == [
        {
            "name": "w1",
            "tensor": "w1:0",
            "shape": [{"name": "rows", "size": ROWS}, {"name": "hidden", "size": 8}],
            "dtype": "float32",
            "trainable": True,
        },
        {
            "name": "w2",
            "tensor": "w2:0",
            "shape": [{"name": "hidden", "size": 8}, {"name": "classes", "size": 3}],
            "dtype": "float32",
            "trainable": True,
        },
        {
            "name": "steps",
            "tensor": "steps:0",
            "shape": [],
            "dtype": "int32",
            "trainable": False,
        },
    ]
    assert doc["outputs"] == [t.name for t in b.outputs]
    first = next(op for op in doc["operations"] if op["op_type"] == "Einsum")
    assert first["inputs"] == ["x:0", "w1:0"]
    assert first["flops"] == 2.0 * BATCH * ROWS * HIDDEN
    assert first["splittable_dims"] == ["batch", "hidden", "rows"]
    assert first["unsplittable_dims"] == []
    assign = next(op for op in doc["operations"] if op["op_type"] == "Assign")
    assert assign["outputs"] == [] and assign["attrs"] == {
        "mode": "assign",
        "variable": "w1",
    }


@pytest.mark.parametrize("which", sorted(GRAPHS))
@pytest.mark.parametrize(
    "mesh_shape, rules",
    [("all:2", "batch:all"), ("all:2", "hidden:all"), ("a:2;b:2", "batch:a;hidden:b")],
)
def test_rebuilt_ops_report_the_same_communication_as_the_originals(
    which: str, mesh_shape: str, rules: str
) -> None:
    b = GRAPHS[which]()
    loaded = round_trip(b)
    ctx = LayoutContext.make(mesh_shape, rules)
    specs = [op.communication(ctx) for op in b.graph.operations]
    assert [op.communication(ctx) for op in loaded.graph.operations] == specs
    assert any(specs), "the layout should make at least one op communicate"


def test_transformer_lm_with_adam_round_trips() -> None:
    from mtf_core.models import TransformerConfig, build_lm

    model = build_lm(TransformerConfig(num_layers=1), optimizer="adam")
    doc = mtf.graph_to_dict(model.graph, outputs=[model.loss, model.logits])
    loaded = mtf.graph_from_dict(doc, check_derived=True)
    assert [(op.op_type, op.name) for op in loaded.graph.operations] == [
        (op.op_type, op.name) for op in model.graph.operations
    ]
    assert [t.shape for t in loaded.outputs] == [model.loss.shape, model.logits.shape]
    assert sum(op.flops() for op in loaded.graph.operations) == sum(
        op.flops() for op in model.graph.operations
    )
    assert len(loaded.graph.trainable_variables) == len(model.graph.trainable_variables)


def test_a_causal_bias_is_written_by_its_shape_not_its_values() -> None:
    # As a Constant, length 2048 wrote 4,194,304 numbers (42 MB of JSON), over
    # the reader's max_constant_elements: `export` wrote what `plan` refused.
    from mtf_core.models import TransformerConfig, build_lm

    model = build_lm(TransformerConfig(num_layers=1, length=2048, batch=2))
    text = mtf.graph_to_json(model.graph, outputs=[model.loss])
    assert len(text) < 200_000
    (op,) = [o for o in json.loads(text)["operations"] if o["op_type"] == "CausalBias"]
    assert op["attrs"] == {}
    assert [d["size"] for d in op["outputs"][0]["shape"]] == [2048, 2048]
    loaded = mtf.graph_from_json(text)
    (bias,) = [o for o in loaded.graph.operations if o.op_type == "CausalBias"]
    want = np.triu(np.full((2048, 2048), -1e9, np.float32), k=1)
    np.testing.assert_array_equal(bias.value, want)
    assert bias.value.dtype == np.float32


def test_serialization_never_imports_tensorflow() -> None:
    """The planner and the REST API read graphs without loading TensorFlow."""
    code = (
        "import sys, mtf_core as mtf\n"
        "from mtf_core.models import TransformerConfig, build_lm\n"
        "m = build_lm(TransformerConfig(num_layers=1), optimizer='adam')\n"
        "mtf.graph_from_json(mtf.graph_to_json(m.graph, outputs=[m.loss]))\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_docs_example_is_what_graph_to_dict_writes() -> None:
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "graph-format.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(example) == small_doc()


def test_non_finite_constants_survive_strict_json() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    c = mtf.constant(m, [float("-inf"), float("nan"), 1.5], "k:3")
    s = mtf.constant(m, float("inf"))
    text = mtf.graph_to_json(g, outputs=[c, s])
    for token in ("NaN", "Infinity"):
        assert f": {token}" not in text and f", {token}" not in text
    loaded = mtf.graph_from_json(text)
    value = loaded.graph.operations[0].value
    assert np.isneginf(value[0]) and np.isnan(value[1]) and value[2] == 1.5
    assert np.isposinf(loaded.graph.operations[1].value)


def test_imports_with_values_come_back_as_placeholders() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.import_tf_tensor(m, np.ones((2, 3), np.float32), "a:2,b:3")
    loaded = mtf.graph_from_dict(mtf.graph_to_dict(g, outputs=[x]))
    (p,) = loaded.placeholders
    assert p.operation.is_placeholder and p.shape == x.shape and p.name == x.name
    assert loaded.tensor("import:0") is p


def test_gradients_through_a_rebuilt_custom_gradient_op_raise_clearly() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.placeholder(m, "a:2", name="x")
    y = mtf.custom_gradient(
        mtf.square, lambda output_grads, **_: [output_grads[0]], [x]
    )
    loaded = mtf.graph_from_dict(mtf.graph_to_dict(g, outputs=[y]))
    (ly,) = loaded.outputs
    assert ly.operation.op_type == "CustomGradient" and ly.name == y.name
    with pytest.raises(mtf.GraphError, match="not serialized"):
        mtf.gradients([mtf.reduce_sum(ly)], [loaded.tensor("x:0")])


def test_ops_keep_their_mesh_in_a_two_mesh_graph() -> None:
    g = mtf.Graph()
    m1, m2 = mtf.Mesh(g, "m1"), mtf.Mesh(g, "m2")
    a = mtf.relu(mtf.placeholder(m1, "a:2", name="p1"))
    c = mtf.exp(mtf.placeholder(m2, "a:2", name="p2"))
    loaded = mtf.graph_from_dict(mtf.graph_to_dict(g, outputs=[a, c]))
    assert [t.mesh.name for t in loaded.outputs] == ["m1", "m2"]
    assert sorted(loaded.meshes) == ["m1", "m2"]


# -- the registry --------------------------------------------------------------


def _import_all_op_modules() -> None:
    """Imports every module that may define operations (all of mtf_core but the
    TensorFlow-backed lowering)."""
    for info in pkgutil.walk_packages(mtf.__path__, "mtf_core."):
        if not (
            info.name.startswith("mtf_core.lowering")
            or info.name.endswith(".__main__")  # runs a CLI when imported
        ):
            importlib.import_module(info.name)


def _operation_classes() -> list[type[mtf.Operation]]:
    """Operation classes defined in mtf_core, but abstract bases (those that
    keep the base class's op_type: they cannot be instantiated as an op of their
    own)."""
    found: list[type[mtf.Operation]] = []
    stack = list(mtf.Operation.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if (
            cls.__module__.startswith("mtf_core.")
            and cls.op_type != mtf.Operation.op_type
            and cls not in found
        ):
            found.append(cls)
    return sorted(found, key=lambda c: (c.__module__, c.__name__))


def test_every_operation_class_in_mtf_core_has_a_builder() -> None:
    _import_all_op_modules()
    classes = _operation_classes()
    modules = {c.__module__ for c in classes}
    assert {"mtf_core.ops.einsum", "mtf_core.autodiff"} <= modules
    registered = registered_op_types()
    missing = [
        f"{c.__module__}.{c.__name__} (op_type {c.op_type!r})"
        for c in classes
        if registered.get(c.__dict__.get("op_type", "")) is not c
    ]
    assert not missing, f"operation classes without a serialization builder: {missing}"


def test_registering_a_second_class_for_an_op_type_is_refused() -> None:
    class Impostor(mtf.Operation):
        op_type = "Einsum"

    with pytest.raises(SerializationError, match="already registered"):
        register(Impostor)(lambda spec: Impostor([], spec.mesh))

    class NoOwnType(mtf.ops.einsum.Einsum):
        pass

    with pytest.raises(SerializationError, match="does not define its own op_type"):
        register(NoOwnType)


def test_graph_to_dict_refuses_an_op_without_a_builder() -> None:
    class Unregistered(mtf.Operation):
        op_type = "UnregisteredForTest"

    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    mtf.placeholder(m, "a:2")
    Unregistered([], m, name="odd")
    with pytest.raises(
        SerializationError, match=r"operations\[1\]: .*'odd'.*no builder"
    ):
        mtf.graph_to_dict(g)


def test_a_builder_that_ignores_the_declared_name_is_refused() -> None:
    class Nameless(mtf.Operation):
        op_type = "NamelessForTest"

        def __init__(self, mesh: mtf.Mesh, name: str | None = None) -> None:
            super().__init__([], mesh, name)
            self._add_output("a:2", "float32")

    register(Nameless)(lambda spec: Nameless(spec.mesh))  # drops spec.name
    g = mtf.Graph()
    Nameless(mtf.Mesh(g, "m"), name="declared")
    with pytest.raises(
        SerializationError,
        match=r"operations\[0\]: .*named the op 'namelessfortest' instead of "
        r"'declared'",
    ):
        mtf.graph_from_dict(mtf.graph_to_dict(g))


def test_graph_to_dict_refuses_non_json_attrs_and_foreign_outputs() -> None:
    class Weird(mtf.Operation):
        op_type = "WeirdForTest"

        def attrs(self) -> dict[str, Any]:
            return {"fn": object()}

    register(Weird)(lambda spec: Weird([], spec.mesh, spec.name))
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    Weird([], m, name="w")
    with pytest.raises(SerializationError, match=r"operations\[0\]\.attrs\.fn: .*JSON"):
        mtf.graph_to_dict(g)
    other = mtf.Graph()
    t = mtf.placeholder(mtf.Mesh(other, "m"), "a:2")
    with pytest.raises(SerializationError, match=r"outputs\[0\]: .*not a tensor"):
        mtf.graph_to_dict(mtf.Graph(), outputs=[t])


# -- lowering ------------------------------------------------------------------


def _lower_all(
    graph: mtf.Graph,
    mesh: mtf.Mesh,
    feeds: dict[str, np.ndarray],
    values: dict[str, np.ndarray],
    devices: list[str],
) -> tuple[dict[str, np.ndarray], Any]:
    """Lowers on 2 devices (batch split); returns every tensor's full value and
    every variable's value after the graph's assigns, by name."""
    impl = mtf.PlacementMeshImpl("all:2", "batch:all", devices[:2])
    store = mtf.VariableStore(graph, {mesh: impl})
    store.load_dict(values)
    by_name = {t.name: t for t in graph.tensors}
    lowering = mtf.Lowering(
        graph,
        {mesh: impl},
        feeds={by_name[k]: v for k, v in feeds.items()},
        variables=store,
    )
    out = {t.name: lowering.export_to_tf_tensor(t).numpy() for t in graph.tensors}
    out.update({f"var/{k}": v for k, v in store.to_dict().items()})
    return out, lowering


@pytest.mark.tf
@pytest.mark.parametrize("which", sorted(GRAPHS))
def test_rebuilt_graph_lowers_to_the_same_values_as_the_original(
    which: str, devices: list[str]
) -> None:
    b = GRAPHS[which]()
    loaded = round_trip(b)
    rng = np.random.RandomState(1)
    values = {
        v.name: np.asarray(rng.randn(*v.shape.to_integer_list())).astype(v.dtype)
        for v in b.graph.all_variables
    }
    want, low_a = _lower_all(b.graph, b.mesh, b.feeds, values, devices)
    got, low_b = _lower_all(loaded.graph, loaded.meshes["m"], b.feeds, values, devices)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    assert low_a.counters.collectives, "batch split should make ops communicate"
    assert low_b.counters.collectives == low_a.counters.collectives
    assert dict(low_b.counters) == dict(low_a.counters)
    if which == "mlp":  # the assigns ran and moved the weights
        assert not np.allclose(want["var/w1"], values["w1"])
        assert want["var/steps"] == values["steps"] + 1

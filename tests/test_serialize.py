"""Graph serialization: round trips, the builder registry, validation, limits,
and that a rebuilt graph lowers to the same values as the original."""

from __future__ import annotations

import copy
import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mtf_core as mtf
from mtf_core.comm import LayoutContext
from mtf_core.errors import MtfError, SerializationError
from mtf_core.serialization import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Limits,
    register,
    registered_op_types,
)
from mtf_core.serialization.schema import NO_LIMITS

# -- graphs --------------------------------------------------------------------

BATCH, ROWS, HIDDEN, CLASSES = 4, 6, 8, 3


class Built:
    """A graph with its mesh, placeholders (and the feeds they take) and outputs."""

    def __init__(self) -> None:
        self.graph = mtf.Graph()
        self.mesh = mtf.Mesh(self.graph, "m")
        self.feeds: dict[str, np.ndarray] = {}  # placeholder tensor name -> value
        self.outputs: list[mtf.Tensor] = []

    def placeholder(self, shape: str, name: str, dtype: str = "float32") -> mtf.Tensor:
        t = mtf.placeholder(self.mesh, shape, dtype, name=name)
        rng = np.random.RandomState(len(self.feeds))
        dims = t.shape.to_integer_list()
        if dtype == "float32":
            self.feeds[t.name] = rng.randn(*dims).astype(np.float32)
        else:
            self.feeds[t.name] = rng.randint(0, 3, size=dims).astype(dtype)
        return t


def build_mlp() -> Built:
    """A two-layer MLP with its gradients and SGD assigns."""
    b = Built()
    x = b.placeholder(f"batch:{BATCH},rows:{ROWS}", "x")
    labels = b.placeholder(f"batch:{BATCH},classes:{CLASSES}", "labels")
    w1 = mtf.get_variable(b.mesh, "w1", f"rows:{ROWS},hidden:{HIDDEN}")
    w2 = mtf.get_variable(b.mesh, "w2", f"hidden:{HIDDEN},classes:{CLASSES}")
    steps = mtf.get_variable(b.mesh, "steps", "", "int32", trainable=False)
    h = mtf.relu(mtf.einsum([x, w1], output_shape=f"batch:{BATCH},hidden:{HIDDEN}"))
    logits = mtf.einsum([h, w2], output_shape=f"batch:{BATCH},classes:{CLASSES}")
    loss = mtf.reduce_mean(
        mtf.layers.softmax_cross_entropy_with_logits(
            logits, mtf.softmax(labels, "classes"), f"classes:{CLASSES}"
        )
    )
    g1, g2 = mtf.gradients([loss], [w1, w2])
    mtf.assign(w1, w1 - g1 * 0.1)
    mtf.assign_sub(w2, g2 * 0.1)
    mtf.assign_add(steps, mtf.constant(b.mesh, 1, dtype="int32"))
    b.outputs = [loss, logits]
    return b


def build_core_families() -> Built:
    """One or more ops of every core family: creation, elementwise (every
    unary and binary fn), where, add_n, cast, identity, reductions, broadcast,
    custom gradients."""
    b = Built()
    x = b.placeholder(f"batch:{BATCH},hidden:{HIDDEN}", "x")
    y = b.placeholder(f"hidden:{HIDDEN},batch:{BATCH}", "y")
    v = b.placeholder(f"hidden:{HIDDEN}", "v")
    pos = mtf.abs(x) + 0.5  # keeps log/sqrt/pow finite
    outs: list[mtf.Tensor] = []
    for fn in sorted(mtf.ops.elementwise.UNARY):
        if fn == "logical_not":
            outs.append(mtf.logical_not(mtf.greater(x, 0.0)))
        else:
            outs.append(getattr(mtf, fn)(pos if fn in ("log", "sqrt", "rsqrt") else x))
    for fn in sorted(mtf.ops.elementwise.BINARY):
        if fn in ("logical_and", "logical_or"):
            outs.append(getattr(mtf, fn)(mtf.greater(x, 0.0), mtf.less(v, 0.5)))
        elif fn in ("floordiv", "mod", "pow"):
            outs.append(getattr(mtf, fn)(pos, mtf.abs(v) + 1.0))
        else:
            outs.append(getattr(mtf, fn)(x, y if fn in ("add", "sub") else v))
    outs.append(mtf.maximum(x, v, output_shape=f"hidden:{HIDDEN},batch:{BATCH}"))
    outs.append(mtf.where(mtf.greater(x, 0.0), x, v * 2.0))
    outs.append(mtf.add_n([x, mtf.transpose(y, x.shape), x * 3.0]))
    outs.append(mtf.cast(mtf.cast(x * 4.0, "int32"), "float32"))
    outs.append(mtf.stop_gradient(x) + mtf.identity(x))
    for reduce in (mtf.reduce_sum, mtf.reduce_max, mtf.reduce_min, mtf.reduce_mean):
        outs.append(reduce(x, reduced_dim="hidden"))
    outs.append(mtf.reduce_any(mtf.greater(x, 1.0), reduced_dim="batch"))
    outs.append(mtf.reduce_all(mtf.greater(x, -3.0)))
    outs.append(mtf.reduce_logsumexp(x, "hidden"))
    outs.append(mtf.log_softmax(x, "hidden"))
    outs.append(mtf.broadcast(v, f"classes:{CLASSES},hidden:{HIDDEN}"))
    outs.append(mtf.constant(b.mesh, [[1.0, -2.0, 3.0]] * 2, "two:2,three:3"))
    outs.append(mtf.zeros(b.mesh, f"batch:{BATCH}", "int32") + 7)
    outs.append(mtf.constant(b.mesh, True, dtype="bool"))
    custom = mtf.custom_gradient(
        lambda a: mtf.square(a), lambda ins, outs_, gys: [gys[0] * 2.0], [x]
    )
    outs.append(custom)
    outs.append(mtf.recompute_grad(lambda a: mtf.tanh(a) * 2.0, [x]))
    # gradients through the custom ops exist in the graph before serializing
    (gx,) = mtf.gradients([mtf.reduce_sum(custom + outs[-1])], [x])
    outs.append(gx)
    b.outputs = outs
    return b


def build_shape_and_indexing_families() -> Built:
    """Reshapes, the slicing family, indexing, random numbers, with gradients."""
    b = Built()
    x = b.placeholder(f"batch:{BATCH},hidden:{HIDDEN}", "x")
    ids = b.placeholder(f"batch:{BATCH}", "ids", "int32")
    outs: list[mtf.Tensor] = [
        mtf.reshape(x, f"batch:{BATCH},heads:2,d:{HIDDEN // 2}"),
        mtf.rename_dimension(x, "hidden", "features"),
        mtf.replace_dimensions(x, x.shape.dims[1], ["two:2", f"quarter:{HIDDEN // 2}"]),
    ]
    parts = mtf.split(x, "hidden", [2, HIDDEN - 2])
    outs += parts
    outs.append(mtf.concat([parts[1], parts[0]], "hidden"))
    outs.append(mtf.stack([x, x * 2.0], "pair", 1))
    outs += mtf.unstack(mtf.slice(x, 1, 2, "batch"), "batch")
    outs.append(mtf.pad(x, [1, 3], "hidden"))
    outs.append(mtf.shift(x, 1, "batch", wrap=False))
    outs.append(mtf.shift(x, -3, "hidden", wrap=True))
    outs.append(mtf.one_hot(ids, f"classes:{CLASSES}", on_value=2.0, off_value=-1.0))
    outs.append(mtf.range(b.mesh, f"hidden:{HIDDEN}", "float32") + x)
    emb = mtf.get_variable(b.mesh, "emb", f"vocab:5,hidden:{HIDDEN}")
    outs.append(mtf.gather(emb, ids, "vocab"))
    values, indices = mtf.top_k(x, "hidden", "k:3")
    outs += [values, indices, mtf.argmax(x, "hidden")]
    outs.append(mtf.cumsum(x, "hidden", exclusive=True, reverse=True))
    outs.append(mtf.random_uniform(b.mesh, f"batch:{BATCH}", 0, 10, "int32", seed=3))
    outs.append(mtf.random_normal(b.mesh, f"hidden:{HIDDEN}", 1.0, 2.0))
    outs.append(mtf.dropout(x, keep_prob=0.5))
    total = mtf.add_n(
        [mtf.reduce_sum(t) for t in outs if t.dtype == "float32" and t is not x]
    )
    (gx, gemb) = mtf.gradients([total], [x, emb])
    b.outputs = [*outs, total, gx, gemb]
    return b


GRAPHS: dict[str, Callable[[], Built]] = {
    "mlp": build_mlp,
    "core_families": build_core_families,
    "shape_and_indexing_families": build_shape_and_indexing_families,
}

# attrs that describe what is not serialized (values, initializers)
NOT_PRESERVED = {"ImportTensor": {"placeholder"}, "Variable": {"initializer"}}


def comparable_attrs(op: mtf.Operation) -> dict[str, Any]:
    skip = NOT_PRESERVED.get(op.op_type, set())
    return {k: v for k, v in op.attrs().items() if k not in skip}


def round_trip(b: Built, **kw: Any) -> mtf.LoadedGraph:
    text = mtf.graph_to_json(b.graph, outputs=b.outputs)
    return mtf.graph_from_json(text, **kw)


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
    y = mtf.custom_gradient(mtf.square, lambda i, o, gy: [gy[0]], [x])
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
        if not info.name.startswith("mtf_core.lowering"):
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


# -- validation ----------------------------------------------------------------


def small_doc() -> dict[str, Any]:
    """x [batch:4, hidden:8] -> relu -> reduce_sum over hidden."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.placeholder(m, "batch:4,hidden:8", name="x")
    y = mtf.reduce_sum(mtf.relu(x), reduced_dim="hidden")
    w = mtf.get_variable(m, "w", "hidden:8")
    mtf.assign(w, mtf.reduce_sum(x, reduced_dim="batch"))
    return mtf.graph_to_dict(g, outputs=[y])


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _delete(path: tuple[Any, ...]) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


SHAPE_0 = ("operations", 0, "outputs", 0, "shape")
BAD_DOCUMENTS: dict[str, tuple[Callable[[dict], None], str]] = {
    "unknown version": (_set(("version",), 2), r"^version: 2 is not supported"),
    "version not an int": (_set(("version",), "1"), r"^version: expected an integer"),
    "wrong format": (_set(("format",), "onnx"), r"^format: expected 'mtf-graph'"),
    "typo in a top-level field": (
        _set(("operation",), []),
        r"^graph: unknown field\(s\) \['operation'\]",
    ),
    "unknown op_type": (
        _set(("operations", 1, "op_type"), "Frobnicate"),
        r"^operations\[1\]\.op_type: unknown op_type 'Frobnicate'",
    ),
    "dangling input": (
        _set(("operations", 1, "inputs", 0), "nope:0"),
        r"^operations\[1\]\.inputs\[0\]: tensor 'nope:0' is dangling",
    ),
    "input from a later op": (
        _set(("operations", 1, "inputs", 0), "reduce_sum:0"),
        r"^operations\[1\]\.inputs\[0\]: .* not earlier; .*topological order",
    ),
    "input index past the outputs": (
        _set(("operations", 1, "inputs", 0), "x:1"),
        r"^operations\[1\]\.inputs\[0\]: tensor 'x:1' is dangling; .* 1 output",
    ),
    "malformed tensor reference": (
        _set(("operations", 1, "inputs", 0), "x"),
        r"^operations\[1\]\.inputs\[0\]: tensor reference 'x' is malformed",
    ),
    "dangling output": (
        _set(("outputs", 0), "ghost:0"),
        r"^outputs\[0\]: tensor 'ghost:0' is dangling",
    ),
    "zero size": (
        _set((*SHAPE_0, 1, "size"), 0),
        r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.size: dimension 'hidden' has "
        r"size 0; expected a size >= 1",
    ),
    "negative size": (
        _set((*SHAPE_0, 0, "size"), -4),
        r"^operations\[0\]\.outputs\[0\]\.shape\[0\]\.size: .* size -4",
    ),
    "fractional size": (
        _set((*SHAPE_0, 0, "size"), 4.5),
        r"^operations\[0\]\.outputs\[0\]\.shape\[0\]\.size: expected an integer, got "
        r"number 4\.5",
    ),
    "boolean size": (
        _set((*SHAPE_0, 0, "size"), True),
        r"\.shape\[0\]\.size: expected an integer, got boolean",
    ),
    "duplicate dim names": (
        _set((*SHAPE_0, 1, "name"), "batch"),
        r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.name: dimension name 'batch' "
        r"appears twice",
    ),
    "invalid dim name": (
        _set((*SHAPE_0, 1, "name"), "9 lives"),
        r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.name: dimension name '9 lives' "
        r"is invalid",
    ),
    "shape as a string": (
        _set(SHAPE_0, "batch:4,hidden:8"),
        r"^operations\[0\]\.outputs\[0\]\.shape: expected an array, got string",
    ),
    "declared shape differs from the op's": (
        _set(("operations", 1, "outputs", 0, "shape", 1, "size"), 9),
        r"^operations\[1\]\.outputs\[0\]\.shape: declared \[batch:4,hidden:9\] but "
        r"Unary 'relu' computes \[batch:4,hidden:8\]",
    ),
    "declared dtype differs from the op's": (
        _set(("operations", 1, "outputs", 0, "dtype"), "int32"),
        r"^operations\[1\]\.outputs\[0\]\.dtype: declared int32 but Unary 'relu' "
        r"computes float32",
    ),
    "unknown dtype": (
        _set(("operations", 0, "outputs", 0, "dtype"), "float128"),
        r"^operations\[0\]\.outputs\[0\]\.dtype: dtype 'float128' is not supported",
    ),
    "wrong output count": (
        _set(("operations", 1, "outputs"), []),
        r"^operations\[1\]\.outputs: 0 output\(s\) declared but Unary 'relu' computes 1",
    ),
    "output name disagrees": (
        _set(("operations", 1, "outputs", 0, "name"), "relu:7"),
        r"^operations\[1\]\.outputs\[0\]\.name: expected 'relu:0'",
    ),
    "reduction keeps a dim the input lacks": (
        _set(("operations", 2, "outputs", 0, "shape", 0, "name"), "rows"),
        r"^operations\[2\] \(Reduce 'reduce_sum'\): reduce: output dimension rows:4",
    ),
    "duplicate op names": (
        _set(("operations", 2, "name"), "x"),
        r"^operations\[2\]\.name: operation name 'x' is also used by operations\[0\]",
    ),
    "unknown mesh": (
        _set(("operations", 1, "mesh"), "mars"),
        r"^operations\[1\]\.mesh: no mesh named 'mars'",
    ),
    "missing outputs field": (
        _delete(("operations", 1, "outputs")),
        r"^operations\[1\]: missing required field 'outputs'",
    ),
    "unknown op field": (
        _set(("operations", 1, "colour"), "red"),
        r"^operations\[1\]: unknown field\(s\) \['colour'\]",
    ),
    "attr of the wrong type": (
        _set(("operations", 1, "attrs", "fn"), 3),
        r"^operations\[1\]\.attrs\.fn: expected a non-empty string, got number 3",
    ),
    "unknown unary fn": (
        _set(("operations", 1, "attrs", "fn"), "frobnicate"),
        r"^operations\[1\]\.attrs\.fn: 'frobnicate' is not one of \[",
    ),
    "wrong input count": (
        _set(("operations", 1, "inputs"), ["x:0", "x:0"]),
        r"^operations\[1\]\.inputs: Unary takes 1 input\(s\), got 2",
    ),
    "assign to a non-variable": (
        _set(("operations", 5, "inputs", 0), "x:0"),
        r"^operations\[5\]\.inputs\[0\]: x:0 is not a variable's value tensor",
    ),
    "variables summary disagrees": (
        _set(("variables", 0, "trainable"), False),
        r"^variables\[0\]\.trainable: declared False but variable 'w' has True",
    ),
    "variables summary names a non-variable": (
        _set(("variables", 0, "name"), "x"),
        r"^variables\[0\]\.name: no Variable operation is named 'x'",
    ),
    "variables summary misses one": (
        _set(("variables",), []),
        r"^variables: Variable operation\(s\) \['w'\] are not listed",
    ),
    "duplicate mesh names": (
        _set(("meshes",), [{"name": "m"}, {"name": "m"}]),
        r"^meshes\[1\]\.name: mesh name 'm' is used twice",
    ),
    "metadata not an object": (
        _set(("metadata",), [1]),
        r"^metadata: expected an object, got array",
    ),
}


def slicing_doc() -> dict[str, Any]:
    """x -> split, slice, shift; ids -> one_hot; random numbers."""
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    x = mtf.placeholder(m, "batch:4,hidden:8", name="x")
    ids = mtf.placeholder(m, "batch:4", "int32", name="ids")
    mtf.split(x, "hidden", [3, 5])
    mtf.slice(x, 1, 2, "batch")
    mtf.shift(x, 1, "batch", wrap=False)
    mtf.one_hot(ids, "classes:3")
    mtf.random_uniform(m, "batch:4", seed=1)
    return mtf.graph_to_dict(g)


BAD_SLICING_DOCUMENTS: dict[str, tuple[int, str, Any, str]] = {
    # case: (operation index, attr, new value, message)
    "split sizes do not sum": (
        2,
        "sizes",
        [3, 4],
        r"^operations\[2\]\.attrs\.sizes: \[3, 4\] sum to 7, but dimension hidden:8",
    ),
    "split size zero": (
        2,
        "sizes",
        [0, 8],
        r"^operations\[2\]\.attrs\.sizes\[0\]: 0 is less than the minimum 1",
    ),
    "slice past the end": (
        3,
        "begin",
        3,
        r"^operations\[3\]\.attrs: begin 3 and size 2 do not select .* batch:4",
    ),
    "shift over an unknown dim": (
        4,
        "dim",
        "nope",
        r"^operations\[4\]\.attrs\.dim: x:0 \[batch:4,hidden:8\] has no dimension "
        r"'nope'",
    ),
    "one_hot dim without a size": (
        5,
        "output_dim",
        "classes",
        r"^operations\[5\]\.attrs\.output_dim: 'classes' is not a dimension; "
        r"expected 'name:size'",
    ),
    "random params not a pair": (
        6,
        "params",
        [0.0],
        r"^operations\[6\]\.attrs\.params: expected two numbers",
    ),
    "random seed not an integer": (
        6,
        "seed",
        "abc",
        r"^operations\[6\]\.attrs\.seed: expected an integer, got string",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SLICING_DOCUMENTS))
def test_bad_attrs_of_shape_and_indexing_ops_name_the_attr(case: str) -> None:
    i, key, value, message = BAD_SLICING_DOCUMENTS[case]
    doc = slicing_doc()
    mtf.graph_from_dict(copy.deepcopy(doc))
    assert key in doc["operations"][i]["attrs"]
    doc["operations"][i]["attrs"][key] = value
    with pytest.raises(SerializationError, match=message):
        mtf.graph_from_dict(doc)


@pytest.mark.parametrize("case", sorted(BAD_DOCUMENTS))
def test_bad_document_raises_serialization_error_naming_the_field(case: str) -> None:
    edit, message = BAD_DOCUMENTS[case]
    doc = small_doc()
    mtf.graph_from_dict(copy.deepcopy(doc))  # the unedited one is fine
    edit(doc)
    with pytest.raises(SerializationError, match=message) as info:
        mtf.graph_from_dict(doc)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MtfError)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    if isinstance(obj, (dict, list)):
        for k, v in items:
            out += _paths(v, (*prefix, k))
    return out


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 2**70)
    | st.floats(allow_nan=False)
    | st.sampled_from(["", "x", "x:0", "a:2", "NaN", "float32", "relu", "hidden"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["name", "size", "a"]), inner, max_size=2)
    ),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_corrupted_document_is_accepted_or_refused_with_serialization_error(
    data: st.DataObject,
) -> None:
    """What the REST API relies on: bad documents never raise anything else."""
    doc = data.draw(st.sampled_from([small_doc, slicing_doc]))()
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(_paths(doc)[1:]))
        target = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = data.draw(JSON_VALUES)
    try:
        mtf.graph_from_dict(doc)
    except SerializationError:
        pass


def test_small_doc_has_the_layout_the_bad_documents_assume() -> None:
    doc = small_doc()
    assert [op["name"] for op in doc["operations"]] == [
        "x",
        "relu",
        "reduce_sum",
        "w",
        "reduce_sum_1",
        "assign_w",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", r"^graph JSON is not valid JSON: .* line 1 column 2"),
        ("", r"^graph JSON is not valid JSON: Expecting value"),
        ('{"format": NaN}', r"^graph JSON contains NaN, which is not JSON"),
        (b"\xff\xfe{}", r"^graph JSON is not UTF-8"),
        ("[1, 2]", r"^graph: expected an object, got array"),
        ('"mtf-graph"', r"^graph: expected an object, got string"),
        ("{}", r"^graph: missing required field 'format'"),
        ("[" * 100_000 + "]" * 100_000, r"^graph JSON is nested too deeply"),
    ],
)
def test_non_json_input_raises_serialization_error(
    text: str | bytes, message: str
) -> None:
    with pytest.raises(SerializationError, match=message):
        mtf.graph_from_json(text)


def test_graph_from_json_refuses_non_text() -> None:
    with pytest.raises(SerializationError, match="must be str or bytes, got dict"):
        mtf.graph_from_json({"format": "mtf-graph"})  # type: ignore[arg-type]


def test_derived_fields_are_checked_only_when_asked() -> None:
    doc = small_doc()
    doc["operations"][1]["flops"] = 1.0
    doc["operations"][2]["splittable_dims"] = ["batch"]
    mtf.graph_from_dict(copy.deepcopy(doc))  # recomputed, not trusted
    with pytest.raises(
        SerializationError,
        match=r"^operations\[1\]\.flops: declared 1\.0 but Unary 'relu' computes 32\.0",
    ):
        mtf.graph_from_dict(doc, check_derived=True)
    doc["operations"][1]["flops"] = 32.0
    with pytest.raises(
        SerializationError,
        match=r"^operations\[2\]\.splittable_dims: declared \['batch'\] but Reduce "
        r"'reduce_sum' has \['batch', 'hidden'\]",
    ):
        mtf.graph_from_dict(doc, check_derived=True)


def test_hand_written_minimal_document_is_accepted() -> None:
    """Derived fields, names of outputs, attrs and summaries are optional."""
    doc = {
        "format": "mtf-graph",
        "version": 1,
        "meshes": [{"name": "m"}],
        "operations": [
            {
                "name": "x",
                "op_type": "ImportTensor",
                "mesh": "m",
                "outputs": [
                    {
                        "shape": [{"name": "b", "size": 2}, {"name": "h", "size": 3}],
                        "dtype": "float32",
                    }
                ],
            },
            {
                "name": "sum",
                "op_type": "Reduce",
                "mesh": "m",
                "inputs": ["x:0"],
                "outputs": [{"shape": [{"name": "b", "size": 2}], "dtype": "float32"}],
            },
        ],
        "outputs": ["sum:0"],
    }
    loaded = mtf.graph_from_dict(doc)
    (out,) = loaded.outputs
    assert out.operation.reduction == "SUM" and out.operation.flops() == 6.0


@pytest.mark.parametrize(
    "limits, message",
    [
        (
            Limits(max_operations=5),
            r"^operations: count 6 is over the limit max_operations=5$",
        ),
        (
            Limits(max_rank=1),
            r"^operations\[0\]\.outputs\[0\]\.shape: rank 2 is over the limit max_rank=1$",
        ),
        (
            Limits(max_dim_size=7),
            r"^operations\[0\]\.outputs\[0\]\.shape\[1\]\.size: size 8 is over the limit",
        ),
        (
            Limits(max_distinct_dims=1),
            r"^operations\[0\]\.outputs\[0\]\.shape: count of distinct dimension names in the graph 2 is over",
        ),
    ],
)
def test_limits_are_enforced_with_the_field_named(limits: Limits, message: str) -> None:
    doc = small_doc()
    mtf.graph_from_dict(copy.deepcopy(doc), limits=NO_LIMITS)
    with pytest.raises(SerializationError, match=message):
        mtf.graph_from_dict(doc, limits=limits)


def test_json_length_and_constant_size_limits() -> None:
    g = mtf.Graph()
    m = mtf.Mesh(g, "m")
    mtf.constant(m, np.arange(12.0).reshape(3, 4), "a:3,b:4")
    text = mtf.graph_to_json(g)
    mtf.graph_from_json(text, limits=Limits(max_constant_elements=12))
    with pytest.raises(
        SerializationError,
        match=r"attrs\.value: element count 12 is over the limit max_constant_elements=11",
    ):
        mtf.graph_from_json(text, limits=Limits(max_constant_elements=11))
    with pytest.raises(
        SerializationError,
        match=r"^graph JSON: length \d+ is over the limit max_json_bytes=100",
    ):
        mtf.graph_from_json(text, limits=Limits(max_json_bytes=100))


def test_limits_reject_nonsense_bounds() -> None:
    with pytest.raises(SerializationError, match=r"Limits\.max_rank is 0"):
        Limits(max_rank=0)


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

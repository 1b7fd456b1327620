"""Versioned JSON document -> a real mtf Graph, validated field by field.

Every problem raises :class:`~mtf_core.errors.SerializationError` (a
``ValueError``) whose message starts with the path of the offending field, e.g.
``operations[3].inputs[1]: tensor 'h:0' is not defined ...``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mtf_core.errors import MtfError, SerializationError
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.serialization import schema
from mtf_core.serialization.registry import Attrs, OpSpec, TensorSpec, registration
from mtf_core.shapes import Shape

_TOP_KEYS = (
    "format",
    "version",
    "meshes",
    "operations",
    "variables",
    "outputs",
    "metadata",
)
_OP_KEYS = (
    "name",
    "op_type",
    "mesh",
    "inputs",
    "outputs",
    "attrs",
    "splittable_dims",
    "unsplittable_dims",
    "flops",
)
_VAR_KEYS = ("name", "tensor", "shape", "dtype", "trainable")


@dataclass
class LoadedGraph:
    """What :func:`graph_from_dict` returns: the rebuilt graph and its parts."""

    graph: Graph
    #: mesh name -> Mesh
    meshes: dict[str, Mesh]
    #: the document's ``outputs``, as tensors of ``graph``
    outputs: list[Tensor]
    metadata: dict[str, Any] = field(default_factory=dict)

    def tensor(self, name: str) -> Tensor:
        """The tensor called ``name`` (``"op_name:index"``)."""
        op_name, _, index = name.rpartition(":")
        op = self.graph.operation_by_name(op_name)
        if not index.isdigit() or int(index) >= len(op.outputs):
            raise SerializationError(f"operation {op_name!r} has no output {name!r}")
        return op.outputs[int(index)]

    @property
    def placeholders(self) -> list[Tensor]:
        """Outputs of ImportTensor ops, in graph order (values are never
        serialized, so every import is a placeholder to feed)."""
        return [
            op.outputs[0]
            for op in self.graph.operations
            if op.op_type == "ImportTensor"
        ]


def graph_from_json(
    text: str | bytes,
    limits: schema.Limits = schema.DEFAULT_LIMITS,
    check_derived: bool = False,
) -> LoadedGraph:
    """Parses JSON text and rebuilds the graph (see :func:`graph_from_dict`)."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise SerializationError(
            f"graph JSON must be str or bytes, got {type(text).__name__}"
        )
    schema.check_limit(limits, "max_json_bytes", len(text), "graph JSON", "length")
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SerializationError(f"graph JSON is not UTF-8: {e}") from None

    def no_constant(token: str) -> Any:
        raise SerializationError(
            f"graph JSON contains {token}, which is not JSON; non-finite floats "
            'are written as the strings "Infinity", "-Infinity", "NaN"'
        )

    try:
        doc = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise SerializationError(
            f"graph JSON is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except RecursionError:
        raise SerializationError("graph JSON is nested too deeply") from None
    return graph_from_dict(doc, limits=limits, check_derived=check_derived)


def graph_from_dict(
    doc: Any,
    limits: schema.Limits = schema.DEFAULT_LIMITS,
    check_derived: bool = False,
) -> LoadedGraph:
    """Rebuilds a real mtf graph from a document made by :func:`graph_to_dict`.

    Operations are rebuilt by their classes' constructors (through the builder
    registry), so shapes, splittability, flops and ``communication(ctx)`` are
    the ops' own; declared output shapes and dtypes must equal what the ops
    compute.  Imports come back as placeholders and variables with the default
    initializer.

    Args:
      doc: the parsed document.
      limits: hard limits, checked before anything large is built.
      check_derived: also require the informational fields (``flops``,
        ``splittable_dims``, ``unsplittable_dims``) to equal the rebuilt ops'
        values.  Off by default: they are recomputed, and a writer with another
        version of an op's flops formula is not wrong.

    Raises:
      SerializationError: naming the offending field.
    """
    try:
        return _Reader(limits, check_derived).read(doc)
    except RecursionError:
        raise SerializationError("graph is nested too deeply") from None


class _Reader:
    def __init__(self, limits: schema.Limits, check_derived: bool) -> None:
        if not isinstance(limits, schema.Limits):
            raise SerializationError(f"limits must be a Limits, got {limits!r}")
        self.limits = limits
        self.check_derived = check_derived
        self.graph = Graph()
        self.meshes: dict[str, Mesh] = {}
        self.op_index: dict[str, int] = {}  # every declared name -> its index
        self.ops: dict[str, Operation] = {}  # built so far
        self.dim_names: set[str] = set()
        self._shapes: dict[tuple[tuple[str, int], ...], Shape] = {}

    def read(self, doc: Any) -> LoadedGraph:
        doc = schema.expect_object(doc, "graph", ("format", "version"))
        fmt = doc["format"]
        if fmt != schema.FORMAT_NAME:
            raise SerializationError(
                f"format: expected {schema.FORMAT_NAME!r}, got {fmt!r}"
            )
        version = schema.expect_int(doc["version"], "version")
        if version not in schema.SUPPORTED_VERSIONS:
            raise SerializationError(
                f"version: {version} is not supported; this reader reads versions "
                f"{list(schema.SUPPORTED_VERSIONS)}"
            )
        schema.reject_unknown_keys(doc, "graph", _TOP_KEYS)
        self._read_meshes(doc.get("meshes", []))
        ops = schema.expect_list(doc.get("operations", []), "operations")
        schema.check_limit(
            self.limits, "max_operations", len(ops), "operations", "count"
        )
        self._index_names(ops)
        for i, entry in enumerate(ops):
            self._read_operation(entry, i)
        if "variables" in doc:
            self._check_variables(doc["variables"])
        outputs = [
            self._resolve(ref, f"outputs[{i}]", len(ops))
            for i, ref in enumerate(
                schema.expect_list(doc.get("outputs", []), "outputs")
            )
        ]
        metadata = doc.get("metadata", {})
        schema.expect_object(metadata, "metadata")
        metadata = schema.json_safe(metadata, "metadata")
        return LoadedGraph(self.graph, dict(self.meshes), outputs, metadata)

    # -- top level -------------------------------------------------------------
    def _read_meshes(self, value: Any) -> None:
        for i, entry in enumerate(schema.expect_list(value, "meshes")):
            path = f"meshes[{i}]"
            obj = schema.expect_object(entry, path, ("name",))
            schema.reject_unknown_keys(obj, path, ("name",))
            name = schema.expect_str(obj["name"], f"{path}.name")
            if name in self.meshes:
                raise SerializationError(
                    f"{path}.name: mesh name {name!r} is used twice"
                )
            self.meshes[name] = Mesh(self.graph, name)

    def _index_names(self, ops: list[Any]) -> None:
        for i, entry in enumerate(ops):
            path = f"operations[{i}]"
            obj = schema.expect_object(
                entry, path, ("name", "op_type", "mesh", "outputs")
            )
            name = schema.expect_str(obj["name"], f"{path}.name")
            if name in self.op_index:
                raise SerializationError(
                    f"{path}.name: operation name {name!r} is also used by "
                    f"operations[{self.op_index[name]}]; names must be unique"
                )
            self.op_index[name] = i

    def _resolve(self, ref: Any, path: str, here: int) -> Tensor:
        """The tensor a ``"op_name:index"`` reference names."""
        ref = schema.expect_str(ref, path)
        op_name, sep, index = ref.rpartition(":")
        if not sep or not (index.isascii() and index.isdigit()):
            raise SerializationError(
                f"{path}: tensor reference {ref!r} is malformed; expected "
                "'op_name:output_index', e.g. 'einsum:0'"
            )
        if op_name not in self.op_index:
            raise SerializationError(
                f"{path}: tensor {ref!r} is dangling; no operation is named {op_name!r}"
            )
        where = self.op_index[op_name]
        if where >= here:
            raise SerializationError(
                f"{path}: tensor {ref!r} comes from operations[{where}], which is "
                "not earlier; operations must be listed in topological order"
            )
        op = self.ops[op_name]
        if int(index) >= len(op.outputs):
            raise SerializationError(
                f"{path}: tensor {ref!r} is dangling; operation {op_name!r} has "
                f"{len(op.outputs)} output(s)"
            )
        return op.outputs[int(index)]

    # -- one operation ---------------------------------------------------------
    def _read_operation(self, entry: Mapping[str, Any], i: int) -> None:
        path = f"operations[{i}]"
        schema.reject_unknown_keys(entry, path, _OP_KEYS)
        name = entry["name"]
        op_type = schema.expect_str(entry["op_type"], f"{path}.op_type")
        reg = registration(op_type)
        if reg is None:
            from mtf_core.serialization.registry import registered_op_types

            raise SerializationError(
                f"{path}.op_type: unknown op_type {op_type!r}; known: "
                f"{sorted(registered_op_types())}"
            )
        mesh_name = schema.expect_str(entry["mesh"], f"{path}.mesh")
        if mesh_name not in self.meshes:
            raise SerializationError(
                f"{path}.mesh: no mesh named {mesh_name!r} in meshes "
                f"{sorted(self.meshes)}"
            )
        inputs = [
            self._resolve(ref, f"{path}.inputs[{k}]", i)
            for k, ref in enumerate(
                schema.expect_list(entry.get("inputs", []), f"{path}.inputs")
            )
        ]
        outputs = self._read_outputs(entry["outputs"], f"{path}.outputs", name)
        attrs = schema.expect_object(entry.get("attrs", {}), f"{path}.attrs")
        spec = OpSpec(
            op_type=op_type,
            name=name,
            mesh=self.meshes[mesh_name],
            inputs=inputs,
            attrs=Attrs(attrs, f"{path}.attrs", self.limits),
            outputs=outputs,
            path=path,
            limits=self.limits,
        )
        n_before = len(self.graph.operations)
        try:
            op = reg.builder(spec)
        except SerializationError:
            raise
        except (MtfError, ValueError, TypeError, KeyError, IndexError) as e:
            raise SerializationError(f"{path} ({op_type} {name!r}): {e}") from None
        created = self.graph.operations[n_before:]
        if created != [op] or not isinstance(op, reg.op_class):
            # A builder bug, not bad input: extra ops would shift later names.
            raise SerializationError(
                f"{path}: the builder registered for {op_type} made {created} "
                f"instead of one {reg.op_class.__name__}"
            )
        if op.name != name:
            # Declared names are unique and every builder passes spec.name, so
            # only a builder that ignores it gets here.
            raise SerializationError(
                f"{path}: the builder registered for {op_type} named the op "
                f"{op.name!r} instead of {name!r}"
            )
        if op.mesh is not spec.mesh:
            raise SerializationError(
                f"{path}.mesh: declared {mesh_name!r} but the op's inputs live on "
                f"mesh {op.mesh.name!r}"
            )
        self._compare_outputs(op, outputs, f"{path}.outputs")
        if self.check_derived:
            self._compare_derived(op, entry, path)
        self.ops[name] = op

    def _read_outputs(self, value: Any, path: str, op_name: str) -> list[TensorSpec]:
        specs = []
        for k, item in enumerate(schema.expect_list(value, path)):
            where = f"{path}[{k}]"
            obj = schema.expect_object(item, where, ("shape", "dtype"))
            schema.reject_unknown_keys(obj, where, ("name", "shape", "dtype"))
            if "name" in obj and obj["name"] != f"{op_name}:{k}":
                raise SerializationError(
                    f"{where}.name: expected {op_name + ':' + str(k)!r} (operation "
                    f"name and output index), got {obj['name']!r}"
                )
            shape = self._shape(obj["shape"], f"{where}.shape")
            self.dim_names.update(shape.dimension_names)
            schema.check_limit(
                self.limits,
                "max_distinct_dims",
                len(self.dim_names),
                f"{where}.shape",
                "count of distinct dimension names in the graph",
            )
            specs.append(
                TensorSpec(shape, schema.parse_dtype(obj["dtype"], f"{where}.dtype"))
            )
        return specs

    def _shape(self, value: Any, path: str) -> Shape:
        """:func:`schema.parse_shape`, memoized: graphs repeat few shapes."""
        try:
            key = tuple((d["name"], d["size"]) for d in value if len(d) == 2)
        except (TypeError, KeyError):
            key = None
        # exact types only: True == 1 and 1.0 == 1 would alias valid sizes
        if (
            key is not None
            and len(key) == len(value)
            and all(type(n) is str and type(s) is int for n, s in key)
        ):
            shape = self._shapes.get(key)
            if shape is None:
                shape = schema.parse_shape(value, path, self.limits)
                self._shapes[key] = shape
            return shape
        return schema.parse_shape(value, path, self.limits)

    def _compare_outputs(
        self, op: Operation, declared: list[TensorSpec], path: str
    ) -> None:
        computed = op.outputs
        if len(computed) != len(declared):
            raise SerializationError(
                f"{path}: {len(declared)} output(s) declared but {op.op_type} "
                f"{op.name!r} computes {len(computed)}"
            )
        for k, (t, spec) in enumerate(zip(computed, declared)):
            if t.shape != spec.shape:
                raise SerializationError(
                    f"{path}[{k}].shape: declared [{spec.shape}] but {op.op_type} "
                    f"{op.name!r} computes [{t.shape}]"
                )
            if t.dtype != spec.dtype:
                raise SerializationError(
                    f"{path}[{k}].dtype: declared {spec.dtype} but {op.op_type} "
                    f"{op.name!r} computes {t.dtype}"
                )

    def _compare_derived(
        self, op: Operation, entry: Mapping[str, Any], path: str
    ) -> None:
        for key, actual in (
            ("splittable_dims", op.splittable_dims()),
            ("unsplittable_dims", op.unsplittable_dims()),
        ):
            if key in entry:
                names = schema.expect_list(entry[key], f"{path}.{key}")
                if sorted(map(str, names)) != sorted(actual):
                    raise SerializationError(
                        f"{path}.{key}: declared {sorted(map(str, names))} but "
                        f"{op.op_type} {op.name!r} has {sorted(actual)}"
                    )
        if "flops" in entry:
            declared = schema.expect_number(entry["flops"], f"{path}.flops")
            try:
                actual_flops = float(op.flops())
            except OverflowError:
                raise SerializationError(
                    f"{path}: {op.op_type} {op.name!r} has more flops than a float "
                    "holds"
                ) from None
            if not math.isclose(declared, actual_flops, rel_tol=1e-9):
                raise SerializationError(
                    f"{path}.flops: declared {declared} but {op.op_type} "
                    f"{op.name!r} computes {actual_flops}"
                )

    # -- variables -------------------------------------------------------------
    def _check_variables(self, value: Any) -> None:
        """The ``variables`` summary must agree with the Variable operations."""
        actual = {v.name: v for v in self.graph.all_variables}
        listed: set[str] = set()
        for i, entry in enumerate(schema.expect_list(value, "variables")):
            path = f"variables[{i}]"
            obj = schema.expect_object(entry, path, _VAR_KEYS)
            schema.reject_unknown_keys(obj, path, _VAR_KEYS)
            name = schema.expect_str(obj["name"], f"{path}.name")
            var = actual.get(name)
            if var is None:
                raise SerializationError(
                    f"{path}.name: no Variable operation is named {name!r}"
                )
            if name in listed:
                raise SerializationError(f"{path}.name: {name!r} is listed twice")
            listed.add(name)
            checks = (
                ("tensor", obj["tensor"], var.outputs[0].name),
                (
                    "shape",
                    schema.parse_shape(obj["shape"], f"{path}.shape", self.limits),
                    var.shape,
                ),
                ("dtype", schema.parse_dtype(obj["dtype"], f"{path}.dtype"), var.dtype),
                (
                    "trainable",
                    schema.expect_bool(obj["trainable"], f"{path}.trainable"),
                    var.trainable,
                ),
            )
            for key, got, want in checks:
                if got != want:
                    raise SerializationError(
                        f"{path}.{key}: declared {got} but variable {name!r} has {want}"
                    )
        missing = sorted(set(actual) - listed)
        if missing:
            raise SerializationError(
                f"variables: Variable operation(s) {missing} are not listed"
            )

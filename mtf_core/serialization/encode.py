"""Graph -> versioned JSON document (see ``docs/graph-format.md``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mtf_core.errors import SerializationError
from mtf_core.graph import Graph, Operation, Tensor
from mtf_core.serialization import schema
from mtf_core.serialization.registry import registration


def _operation_to_dict(op: Operation, index: int) -> dict[str, Any]:
    path = f"operations[{index}]"
    reg = registration(op.op_type)
    if reg is None or reg.op_class is not type(op):
        owner = "no builder" if reg is None else f"a builder for {reg.op_class}"
        raise SerializationError(
            f"{path}: operation {op.name!r} of class {type(op).__name__} has op_type "
            f"{op.op_type!r}, which has {owner}; register one in "
            "mtf_core.serialization"
        )
    return {
        "name": op.name,
        "op_type": op.op_type,
        "mesh": op.mesh.name,
        "inputs": [t.name for t in op.inputs],
        "outputs": [
            {
                "name": t.name,
                "shape": schema.shape_to_json(t.shape),
                "dtype": t.dtype,
            }
            for t in op.outputs
        ],
        "attrs": schema.json_safe(op.attrs(), f"{path}.attrs"),
        "splittable_dims": sorted(op.splittable_dims()),
        "unsplittable_dims": sorted(op.unsplittable_dims()),
        "flops": float(op.flops()),
    }


def graph_to_dict(
    graph: Graph,
    outputs: Sequence[Tensor] = (),
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON-able document describing ``graph``.

    Args:
      graph: the graph; every operation's class needs a registered builder.
      outputs: tensors of ``graph`` the reader should treat as the results
        (a loss, logits); stored by name.
      metadata: free-form JSON-able object kept as is (a model name, ...).

    >>> import mtf_core as mtf
    >>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
    >>> y = mtf.reduce_sum(mtf.placeholder(m, "b:4,h:8", name="x"), reduced_dim="h")
    >>> doc = mtf.graph_to_dict(g, outputs=[y])
    >>> doc["version"], [op["op_type"] for op in doc["operations"]], doc["outputs"]
    (1, ['ImportTensor', 'Reduce'], ['reduce_sum:0'])
    """
    if not isinstance(graph, Graph):
        raise SerializationError(f"graph_to_dict needs an mtf.Graph, got {graph!r}")
    mesh_names = [m.name for m in graph.meshes]
    dup = sorted({n for n in mesh_names if mesh_names.count(n) > 1})
    if dup:
        raise SerializationError(
            f"graph has several meshes named {dup}; mesh names must be distinct to "
            "be serialized"
        )
    out_names = []
    for i, t in enumerate(outputs):
        if not isinstance(t, Tensor) or t.graph is not graph:
            raise SerializationError(
                f"outputs[{i}]: {t!r} is not a tensor of this graph"
            )
        out_names.append(t.name)
    doc: dict[str, Any] = {
        "format": schema.FORMAT_NAME,
        "version": schema.FORMAT_VERSION,
        "meshes": [{"name": n} for n in mesh_names],
        "operations": [
            _operation_to_dict(op, i) for i, op in enumerate(graph.operations)
        ],
        "variables": [
            {
                "name": v.name,
                "tensor": v.outputs[0].name,
                "shape": schema.shape_to_json(v.shape),
                "dtype": v.dtype,
                "trainable": v.trainable,
            }
            for v in graph.all_variables
        ],
        "outputs": out_names,
    }
    if metadata is not None:
        doc["metadata"] = schema.json_safe(dict(metadata), "metadata")
    return doc


def graph_to_json(
    graph: Graph,
    outputs: Sequence[Tensor] = (),
    metadata: Mapping[str, Any] | None = None,
    indent: int | None = None,
) -> str:
    """:func:`graph_to_dict` as strict JSON text (no NaN/Infinity tokens)."""
    return json.dumps(
        graph_to_dict(graph, outputs, metadata), indent=indent, allow_nan=False
    )

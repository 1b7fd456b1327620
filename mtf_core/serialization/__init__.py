"""Graph serialization: a versioned JSON form of an mtf graph, and back.

The document lists meshes, operations in graph order (type, name, mesh, input
tensor references, outputs with shape and dtype, attrs, splittability, flops),
the variables and the caller's output tensors; ``docs/graph-format.md`` is the
schema.  Reading rebuilds a real :class:`~mtf_core.graph.Graph` whose ops are
the real op classes (through a builder registry), so the planner's cost model
can ask them ``communication(ctx)``.

>>> import mtf_core as mtf
>>> g = mtf.Graph(); m = mtf.Mesh(g, "m")
>>> x = mtf.placeholder(m, "batch:4,hidden:8", name="x")
>>> loaded = mtf.graph_from_json(mtf.graph_to_json(g, outputs=[mtf.relu(x)]))
>>> [str(t.shape) for t in loaded.outputs], loaded.placeholders[0].name
(['batch:4,hidden:8'], 'x:0')
"""

# Importing the builder modules registers their builders.
from mtf_core.serialization import (
    builders,
    builders_compat,
    builders_control,
    builders_conv,
    builders_indexing,
    builders_slicing,
    builders_stored,
)
from mtf_core.serialization.decode import LoadedGraph, graph_from_dict, graph_from_json
from mtf_core.serialization.encode import graph_to_dict, graph_to_json
from mtf_core.serialization.registry import (
    Attrs,
    OpSpec,
    TensorSpec,
    register,
    registered_op_types,
)
from mtf_core.serialization.schema import (
    DEFAULT_LIMITS,
    FORMAT_NAME,
    FORMAT_VERSION,
    NO_LIMITS,
    SUPPORTED_VERSIONS,
    Limits,
)

__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "NO_LIMITS",
    "SUPPORTED_VERSIONS",
    "Attrs",
    "Limits",
    "LoadedGraph",
    "OpSpec",
    "TensorSpec",
    "builders",
    "builders_compat",
    "builders_control",
    "builders_conv",
    "builders_indexing",
    "builders_slicing",
    "builders_stored",
    "graph_from_dict",
    "graph_from_json",
    "graph_to_dict",
    "graph_to_json",
    "register",
    "registered_op_types",
]

"""mtf_core: Mesh TensorFlow's named-dimension language for TensorFlow 2.

>>> import mtf_core as mtf
>>> graph = mtf.Graph()
>>> mesh = mtf.Mesh(graph, "my_mesh")
>>> x = mtf.zeros(mesh, "batch:4,hidden:8")
>>> str(mtf.reduce_sum(x, reduced_dim="hidden").shape)
'batch:4'

The TensorFlow-facing parts (``Lowering``, ``placement_mesh_impl``,
``PlacementMeshImpl``, ``compile_function``) load TensorFlow on first use, so
planning code that never lowers stays TensorFlow-free.
"""

from __future__ import annotations

import importlib
from typing import Any

from mtf_core import dtypes, extensions
from mtf_core.autodiff import custom_gradient, gradients, recompute_grad
from mtf_core.errors import (
    DTypeError,
    GraphError,
    IndivisibleDimensionError,
    LayoutError,
    LoweringError,
    MtfError,
    SerializationError,
    ShapeError,
)
from mtf_core.graph import Graph, Mesh, Operation, Tensor
from mtf_core.layout import LayoutRules, TensorLayout, convert_to_layout_rules
from mtf_core.ops.creation import (
    Constant,
    ImportTensor,
    constant,
    fill,
    import_tf_tensor,
    ones,
    ones_like,
    placeholder,
    zeros,
    zeros_like,
)
from mtf_core.ops.einsum import Einsum, einsum, matmul
from mtf_core.ops.elementwise import (
    abs,
    add,
    add_n,
    cast,
    ceil,
    cos,
    divide,
    elu,
    equal,
    exp,
    floor,
    floordiv,
    gelu,
    greater,
    greater_equal,
    identity,
    is_finite,
    leaky_relu,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    mod,
    multiply,
    negative,
    not_equal,
    pow,
    reciprocal,
    relu,
    round,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    softplus,
    sqrt,
    square,
    stop_gradient,
    sub,
    subtract,
    swish,
    tanh,
    where,
)
from mtf_core.ops.reduce import (
    broadcast,
    log_softmax,
    reduce_all,
    reduce_any,
    reduce_logsumexp,
    reduce_max,
    reduce_mean,
    reduce_min,
    reduce_sum,
    softmax,
    transpose,
)
from mtf_core.ops.variables import (
    Assign,
    Variable,
    assign,
    assign_add,
    assign_sub,
    get_variable,
)
from mtf_core.shapes import (
    Dimension,
    MeshShape,
    Shape,
    convert_to_dimension,
    convert_to_shape,
)

float32 = dtypes.float32
float16 = dtypes.float16
bfloat16 = dtypes.bfloat16
int32 = dtypes.int32
int64 = dtypes.int64

# Loaded on first use: these import TensorFlow.
_LAZY = {
    "Lowering": ("mtf_core.lowering.lowering", "Lowering"),
    "PlacementMeshImpl": ("mtf_core.lowering.placement", "PlacementMeshImpl"),
    "placement_mesh_impl": ("mtf_core.lowering.placement", None),
    "VariableStore": ("mtf_core.lowering.variables", "VariableStore"),
    "compile_function": ("mtf_core.lowering.steps", "compile_function"),
    "CompiledFunction": ("mtf_core.lowering.compiled", "CompiledFunction"),
    "logical_devices": ("mtf_core.lowering.devices", "logical_cpu_devices"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    # The layout planner's names (mtf.auto_layout, mtf.auto_mtf, mtf.PlanOptions)
    # come from the packages above this one, which declare them as entry
    # points: mtf_core.extensions is the seam, and mtf_core never imports them.
    if name in extensions.names():
        return extensions.load(name)
    raise AttributeError(f"module 'mtf_core' has no attribute {name!r}")


# Layers; models, optimizers and layout presets.
from mtf_core import layers, models, optimize, presets  # noqa: E402
from mtf_core.errors import ConfigError  # noqa: E402
from mtf_core.ops.conv import conv2d  # noqa: E402
from mtf_core.ops.indexing import argmax, cumsum, gather, one_hot, top_k  # noqa: E402
from mtf_core.ops.indexing import mtf_range as range  # noqa: E402, A001
from mtf_core.ops.random import dropout, random_normal, random_uniform  # noqa: E402
from mtf_core.ops.reshape import (  # noqa: E402
    rename_dimension,
    replace_dimensions,
    reshape,
)
from mtf_core.ops.slicing import (  # noqa: E402
    concat,
    pad,
    shift,
    slice,  # noqa: A004
    split,
    stack,
    unstack,
)
from mtf_core.serialization import (  # noqa: E402
    LoadedGraph,
    graph_from_dict,
    graph_from_json,
    graph_to_dict,
    graph_to_json,
)

# The SPMD backend and multi-process meshes: TensorFlow on first use.
_LAZY["SimdMeshImpl"] = ("mtf_core.lowering.spmd", "SimdMeshImpl")
_LAZY["simd_mesh_impl"] = ("mtf_core.lowering.spmd", None)
_LAZY["ClusterSpec"] = ("mtf_core.lowering.cluster", "ClusterSpec")

# Mesh TensorFlow's mixed-precision variables, op helpers and decoding, its
# mtf.utils (variable placement) and the TF1 loop.
from mtf_core import beam_search, utils  # noqa: E402
from mtf_core.dtypes import VariableDType  # noqa: E402

# Op arguments outside what an op accepts (a reduction, a probability, ...).
from mtf_core.errors import ArgumentError  # noqa: E402
from mtf_core.layout import (  # noqa: E402
    tensor_dim_to_mesh_dim_size,
    tensor_dim_to_size_per_split,
)
from mtf_core.ops.control import WhileLoop, while_loop  # noqa: E402
from mtf_core.ops.creation import import_fully_replicated  # noqa: E402
from mtf_core.ops.dynamic_shift import dynamic_shift  # noqa: E402
from mtf_core.ops.elementwise import to_bfloat16, to_float, to_int32  # noqa: E402
from mtf_core.ops.halo import halo_exchange, left_halo_exchange  # noqa: E402
from mtf_core.ops.indexing import mtf_range  # noqa: E402
from mtf_core.ops.reshape import anonymize, anonymous_shape, is_anonymous  # noqa: E402
from mtf_core.ops.selection import (  # noqa: E402
    nth_largest_element,
    nth_smallest_element,
    pool_tensor_1d,
    reduce_first,
    sample_with_temperature,
    stride_tensor_1d,
    top_1,
)
from mtf_core.ops.unary import selu, squared_relu  # noqa: E402

_LAZY["MeshImpl"] = ("mtf_core.lowering.mesh_impl", "MeshImpl")
from mtf_core.ops.slicewise import (  # noqa: E402
    GenericGradOperation,
    Print,
    SlicewiseOperation,
    depend,
    slicewise,
)
from mtf_core.ops.summary import ScalarSummaryOperation, scalar_summary  # noqa: E402

_LAZY["MtfRestoreHook"] = ("mtf_core.lowering.hooks", "MtfRestoreHook")
_LAZY["MtfCheckpointSaverListener"] = (
    "mtf_core.lowering.hooks",
    "MtfCheckpointSaverListener",
)

# The names above are the public ones (mypy's strict re-export rule and
# ``import *`` read this list); the TensorFlow-facing names in ``_LAZY`` and
# the upper packages' names come through ``__getattr__``.
__all__ = [
    "ArgumentError",
    "Assign",
    "ConfigError",
    "Constant",
    "DTypeError",
    "Dimension",
    "Einsum",
    "GenericGradOperation",
    "Graph",
    "GraphError",
    "ImportTensor",
    "IndivisibleDimensionError",
    "LayoutError",
    "LayoutRules",
    "LoadedGraph",
    "LoweringError",
    "Mesh",
    "MeshShape",
    "MtfError",
    "Operation",
    "Print",
    "ScalarSummaryOperation",
    "SerializationError",
    "Shape",
    "ShapeError",
    "SlicewiseOperation",
    "Tensor",
    "TensorLayout",
    "Variable",
    "VariableDType",
    "WhileLoop",
    "abs",
    "add",
    "add_n",
    "anonymize",
    "anonymous_shape",
    "argmax",
    "assign",
    "assign_add",
    "assign_sub",
    "beam_search",
    "bfloat16",
    "broadcast",
    "cast",
    "ceil",
    "concat",
    "constant",
    "conv2d",
    "convert_to_dimension",
    "convert_to_layout_rules",
    "convert_to_shape",
    "cos",
    "cumsum",
    "custom_gradient",
    "depend",
    "divide",
    "dropout",
    "dynamic_shift",
    "dtypes",
    "einsum",
    "elu",
    "equal",
    "exp",
    "extensions",
    "fill",
    "float16",
    "float32",
    "floor",
    "floordiv",
    "gather",
    "gelu",
    "get_variable",
    "gradients",
    "graph_from_dict",
    "graph_from_json",
    "graph_to_dict",
    "graph_to_json",
    "greater",
    "greater_equal",
    "halo_exchange",
    "identity",
    "import_fully_replicated",
    "import_tf_tensor",
    "int32",
    "int64",
    "is_anonymous",
    "is_finite",
    "layers",
    "leaky_relu",
    "left_halo_exchange",
    "less",
    "less_equal",
    "log",
    "log_softmax",
    "logical_and",
    "logical_not",
    "logical_or",
    "matmul",
    "maximum",
    "minimum",
    "mod",
    "models",
    "mtf_range",
    "multiply",
    "negative",
    "not_equal",
    "nth_largest_element",
    "nth_smallest_element",
    "one_hot",
    "ones",
    "ones_like",
    "optimize",
    "pad",
    "placeholder",
    "pool_tensor_1d",
    "pow",
    "presets",
    "random_normal",
    "random_uniform",
    "range",
    "reciprocal",
    "recompute_grad",
    "reduce_all",
    "reduce_any",
    "reduce_first",
    "reduce_logsumexp",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_sum",
    "relu",
    "rename_dimension",
    "replace_dimensions",
    "reshape",
    "round",
    "rsqrt",
    "sample_with_temperature",
    "scalar_summary",
    "selu",
    "shift",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "slice",
    "slicewise",
    "softmax",
    "softplus",
    "split",
    "sqrt",
    "square",
    "squared_relu",
    "stack",
    "stop_gradient",
    "stride_tensor_1d",
    "sub",
    "subtract",
    "swish",
    "tanh",
    "tensor_dim_to_mesh_dim_size",
    "tensor_dim_to_size_per_split",
    "to_bfloat16",
    "to_float",
    "to_int32",
    "top_1",
    "top_k",
    "transpose",
    "unstack",
    "utils",
    "where",
    "while_loop",
    "zeros",
    "zeros_like",
]

"""Graphs and hardware the planner tests share (and a check of each).

No TensorFlow here: building graphs and planning never load it.
"""

from __future__ import annotations

from dataclasses import dataclass

import mtf_core as mtf
from cost_models import HardwareProfile, LinkSpec
from mtf_core.models import ModelGraph, TransformerConfig, build_lm

NVLINK = LinkSpec("nvlink", 300e9, 3e-6)
INFINIBAND = LinkSpec("infiniband", 25e9, 6e-6)
SLOW = LinkSpec("slow-ethernet", 1e9, 20e-6)


def gpu(
    axis_links: dict[str, LinkSpec] | None = None, memory_bytes: int = 80 * 2**30
) -> HardwareProfile:
    """A GPU-like device (100 TFLOP/s, 2 TB/s HBM); links per mesh axis name,
    NVLink for axes not named."""
    return HardwareProfile(
        "test-gpu",
        peak_flops=100e12,
        memory_bytes=memory_bytes,
        hbm_bandwidth_bytes_per_s=2e12,
        default_link=NVLINK,
        axis_links=tuple((axis_links or {}).items()),
    )


@dataclass
class MtfExample:
    """Mesh TensorFlow's auto_mtf test graph: ``z = einsum(x[a,b], y[b,c])``."""

    graph: mtf.Graph
    mesh: mtf.Mesh
    z: mtf.Tensor


def mtf_example(unstack: bool = False) -> MtfExample:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    x = mtf.zeros(mesh, "a:10,b:5")
    y = mtf.zeros(mesh, "b:5,c:20")
    z = mtf.einsum([x, y], "a:10,c:20")
    if unstack:
        mtf.unstack(z, "a")
        mtf.unstack(z, "c")
    return MtfExample(graph, mesh, z)


def transformer(**sizes: int) -> ModelGraph:
    """A Transformer LM training step (Adam) from ``mtf_core.models``."""
    config = dict(
        num_layers=1, d_model=16, heads=4, d_kv=4, d_ff=32, vocab=64, length=8, batch=8
    )
    config.update(sizes)
    return build_lm(TransformerConfig(**config), optimizer="adam")


# The regimes of the issue, each: a model, a mesh and hardware.
# Megatron pays: big weights per token, a fast "model" axis and a batch axis
# fast enough that splitting the batch over it still pays.
MEGATRON_SIZES = dict(
    num_layers=1,
    d_model=512,
    heads=8,
    d_kv=64,
    d_ff=2048,
    vocab=4096,
    length=64,
    batch=64,
)
MEGATRON_MESH = "batch:2;model:4"
MEGATRON_HW = gpu({"batch": INFINIBAND, "model": NVLINK})

# Data parallelism pays: many tokens, small weights.
DATA_PARALLEL_SIZES = dict(
    num_layers=1,
    d_model=128,
    heads=4,
    d_kv=32,
    d_ff=256,
    vocab=512,
    length=64,
    batch=512,
)
# Replicated weights are fastest, but with their Adam slots they do not fit
# once the memory limit drops: splitting them over the slow axis is the price.
PRESSURE_SIZES = dict(
    num_layers=1,
    d_model=512,
    heads=8,
    d_kv=64,
    d_ff=2048,
    vocab=512,
    length=64,
    batch=128,
)
PRESSURE_MESH = "b:8;m:2"
PRESSURE_HW = gpu({"m": SLOW})


def test_mtf_example_has_the_einsum_of_mesh_tensorflows_test() -> None:
    ex = mtf_example()
    assert str(ex.z.shape) == "a:10,c:20"
    assert [op.op_type for op in ex.graph.operations] == [
        "Constant",
        "Constant",
        "Einsum",
    ]


def test_unstacked_mtf_example_marks_a_and_c_unsplittable() -> None:
    ex = mtf_example(unstack=True)
    marked = set().union(*(op.unsplittable_dims() for op in ex.graph.operations))
    assert marked == {"a", "c"}


def test_transformer_graph_has_the_named_dims_the_baselines_use() -> None:
    model = transformer()
    names = {d.name for t in model.graph.tensors for d in t.shape}
    assert {"batch", "length", "d_model", "heads", "d_kv", "d_ff", "vocab"} <= names
    assert model.updates  # a training step: gradients and Adam updates

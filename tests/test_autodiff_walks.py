"""What ``mtf.gradients`` walks: the ops upstream of its ``ys``, not the graph.

A recomputed block differentiates the copy it makes, and a pipeline takes one
backward per stage and micro-batch; walking every op of the graph each time
made building such graphs grow with the square of their size (GPT-3's 96
layers, every block recomputed: 3.4 s against 0.37 s; a pipelined step of
8 stages and 16 micro-batches: 7.4 s against 0.52 s; ``bench/graph_build.py``).
The graphs built are the same op for op as through a walk of the whole graph.
"""

from __future__ import annotations

from test_scale_recompute import CFG as SMALL

import mtf_core.autodiff as autodiff
import mtf_core.pipeline as pipeline
import mtf_core.recompute as recompute
from mtf_core.models import build_lm
from mtf_core.ops.variables import Variable
from mtf_core.pipeline import PipelineStages, build_pipelined_lm

# test_scale_recompute's small model, deeper, in mixed precision, with its
# optimizer slots shardable too.
CFG = SMALL.replace(num_layers=4, activation_dtype="bfloat16", shardable_slots=True)


def _ops(graph) -> list[tuple[str, str, list[str], list[str]]]:
    return [
        (
            op.op_type,
            op.name,
            [t.name for t in op.inputs],
            [str(t.shape) for t in op.outputs],
        )
        for op in graph.operations
    ]


def test_a_recomputed_blocks_gradient_walks_its_copy_alone(monkeypatch) -> None:
    """Each block's backward differentiates only the copy it made: the walks
    of all blocks together cover each op at most once, and the graph is the
    one a walk through the whole graph gives."""
    cfg = CFG.replace(recompute_attention="block", recompute_ffn="block")
    whole = recompute.gradients
    walked: list[int] = []

    def counting(ys, xs, grad_ys=None, operations=None):
        assert operations is not None
        walked.append(len(operations))
        return whole(ys, xs, grad_ys, operations=operations)

    monkeypatch.setattr(recompute, "gradients", counting)
    model = build_lm(cfg, optimizer="adam")
    assert len(walked) == 2 * cfg.num_layers  # one per block
    assert min(walked) > 0
    assert sum(walked) <= len(model.graph.operations)

    monkeypatch.setattr(
        recompute,
        "gradients",
        lambda ys, xs, grad_ys=None, operations=None: whole(ys, xs, grad_ys),
    )
    assert _ops(build_lm(cfg, optimizer="adam").graph) == _ops(model.graph)


def test_a_pipelines_backward_walks_only_its_own_micro_batch(monkeypatch) -> None:
    """Each backward of a stage on a micro-batch walks that micro-batch's
    work, the stage's variables (made with its first micro-batch) and what
    was made before any work (feeds, masks), never another micro-batch's
    ops; and the graph is the one that listing every op of the graph as
    ``operations`` gives."""
    spec = PipelineStages(2, 4, "1f1b")
    whole = pipeline.gradients
    order = autodiff._position
    walked: list[list] = []

    def recording(ys, xs, grad_ys=None, operations=None):
        walked.append([])
        return whole(ys, xs, grad_ys, operations)

    def position(op):
        walked[-1].append(op)
        return order(op)

    monkeypatch.setattr(pipeline, "gradients", recording)
    monkeypatch.setattr(autodiff, "_position", position)
    model = build_pipelined_lm(CFG, spec, "adam")
    backward = [w for w in model.order if w.phase == "B"]
    assert len(backward) == spec.stages * spec.micro_batches
    graph_ops = len(model.graph.operations)
    for w, ops in zip(backward, walked):
        assert ops, f"{w} walked nothing"
        assert len(ops) < graph_ops / 2, f"{w} walked {len(ops)} of {graph_ops} ops"
        others = {
            (str(model.work[op]), op.op_type) for op in ops
            if op in model.work and model.work[op].micro_batch != w.micro_batch
            and not isinstance(op, Variable)
        }  # fmt: skip
        assert not others, f"{w} walked ops of {sorted(others)}"

    monkeypatch.setattr(
        pipeline,
        "gradients",
        lambda ys, xs, grad_ys=None, operations=None: whole(
            ys, xs, grad_ys, list(ys[0].graph.operations)
        ),
    )
    again = build_pipelined_lm(CFG, spec, "adam")
    assert _ops(again.graph) == _ops(model.graph)


def _small_gradients(corrupt: bool) -> list[tuple[str, str, list[str], list[str]]]:
    import mtf_core as mtf

    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "m")
    x = mtf.placeholder(mesh, "batch:4,d:8")
    w = mtf.get_variable(mesh, "w", "d:8,h:16")
    h = mtf.relu(mtf.einsum([x, w], output_shape="batch:4,h:16"))
    loss = mtf.reduce_sum(h * h)
    if corrupt:
        del h.operation.graph_index  # as if made without Operation.__init__
        loss.operation.graph_index = 0  # as if the list had been reordered
    mtf.gradients([loss], [w])
    return _ops(graph)


def test_ops_out_of_their_place_are_walked_in_the_lists_order() -> None:
    """An op whose index does not match ``graph.operations`` (code that
    reordered the list, or made an op without ``Operation.__init__``) sends
    ``gradients`` to the list's own order: the same gradient ops."""
    assert _small_gradients(corrupt=True) == _small_gradients(corrupt=False)

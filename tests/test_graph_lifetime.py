"""A graph goes when its last user drops it.

Per-graph bookkeeping (``get_variable``'s variables by name, the variables
updated under slot names) refers back to the graph through its variables and
reads.  Held in module-level tables keyed by the graph, even weakly, it kept
every graph alive for the life of the process: a service planning one job
after another grew by every stage graph each plan built.
"""

from __future__ import annotations

import gc
import weakref

from test_scale_slots_sharding import SLOT_CFG

import mtf_core as mtf
from layout_planner.choices import plan_transformer
from mtf_core.models import TransformerConfig, build_lm


def _graphs_alive() -> int:
    gc.collect()
    return sum(isinstance(o, mtf.Graph) for o in gc.get_objects())


def test_a_graph_with_variables_and_sharded_slots_is_freed_when_dropped() -> None:
    model = build_lm(SLOT_CFG)
    graph = model.graph
    assert graph.variables_by_name  # what the tables held
    assert graph.slot_shardings
    ref = weakref.ref(graph)
    del model, graph
    gc.collect()
    assert ref() is None


def test_get_variable_still_returns_one_variable_per_name_and_graph() -> None:
    graphs = [mtf.Graph(), mtf.Graph()]
    meshes = [mtf.Mesh(g, "m") for g in graphs]
    firsts = [mtf.get_variable(m, "w", "a:4") for m in meshes]
    again = mtf.get_variable(meshes[0], "w", "a:4")
    assert again.operation is firsts[0].operation
    assert firsts[1].operation is not firsts[0].operation
    assert len(graphs[0].all_variables) == len(graphs[1].all_variables) == 1


def test_planning_in_one_process_leaves_no_graph_behind() -> None:
    config = TransformerConfig(
        num_layers=4, d_model=64, heads=4, d_kv=16, d_ff=256, vocab=128,
        length=32, batch=16, activation_dtype="bfloat16",
    )  # fmt: skip
    before = _graphs_alive()
    plan = plan_transformer(config, 8, "h100-nvlink-ib", workers=1)
    assert plan.fits
    del plan
    assert _graphs_alive() == before

"""A plan's collectives per op and its memory per tensor, for the dashboard.

The stored plan says what the step costs in total; these tables say where:
each collective the lowering issues (the op it is issued in, that op's output
tensor, kind, mesh axes, bytes and seconds per device) grouped by op, and the
tensors of the largest live set with their bytes per device under the plan's
layout (which dims are split over which mesh axes).  Both come from the
stored graph and ``cost_models``: the same numbers ``evaluate`` prices.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

from cost_models.collectives import collective_time_s
from cost_models.costs import layout_context
from cost_models.hardware import HardwareProfile
from cost_models.memory import memory_model
from mtf_core.comm import CollectiveSpec
from mtf_core.serialization import graph_from_dict

#: Rows of each table (the largest ones); the page says how many were left out.
MAX_ROWS = 40


def plan_detail(
    graph_doc: Mapping[str, Any], plan: Mapping[str, Any], max_rows: int = MAX_ROWS
) -> dict[str, Any]:
    """``{"ops": [...], "ops_total": n, "tensors": [...], "tensors_total": n,
    "peak_bytes": b}`` for ``plan`` (a ``LayoutPlan.to_dict()``) of the graph
    ``graph_doc``.

    Each op row: ``op``, ``type``, ``tensor`` (its first output, with
    ``layout``: ``dim:axis`` for split dims), ``collectives`` (``kind``,
    ``axes``, ``bytes``, ``seconds``), and their summed ``bytes`` and
    ``seconds``; ops by seconds, largest first.  Each tensor row: ``name``,
    ``kind`` (param, slot, activation), ``shape``, ``layout``, ``bytes``
    (per device) and ``share`` of the live set; largest first.
    """
    loaded = graph_from_dict(graph_doc)
    graph = loaded.graph
    mesh = plan["mesh_shape"]
    hw = HardwareProfile.from_dict(plan["hardware"])
    ctx = layout_context(graph, mesh, plan["layout_rules"])
    ops = {op.name: op for op in graph.operations}

    def layout_of(shape: Any) -> str:
        return ",".join(
            f"{d.name}:{ctx.axis_name(a)}"
            for d in shape
            if (a := ctx.effective_mesh_axis(d)) is not None
        )

    by_op: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    evaluation = plan.get("evaluation") or {}
    for c in evaluation.get("collectives", []):
        spec = CollectiveSpec(
            c["kind"], tuple(c["mesh_axes"]), int(c["bytes_per_device"])
        )
        by_op[c.get("op", "")].append(
            {
                "kind": c["kind"],
                "axes": ",".join(c["mesh_axes"]),
                "bytes": int(c["bytes_per_device"]),
                "seconds": collective_time_s(spec, mesh, hw),
            }
        )
    op_rows = []
    for name, items in by_op.items():
        op = ops.get(name)
        out = op.outputs[0] if op is not None and op.outputs else None
        op_rows.append(
            {
                "op": name,
                "type": type(op).__name__ if op is not None else "",
                "tensor": out.name if out is not None else "",
                "shape": str(out.shape) if out is not None else "",
                "layout": layout_of(out.shape) if out is not None else "",
                "collectives": items,
                "bytes": sum(i["bytes"] for i in items),
                "seconds": sum(i["seconds"] for i in items),
            }
        )
    op_rows.sort(key=lambda r: (-r["seconds"], -r["bytes"], r["op"]))

    mm = memory_model(graph, loaded.outputs)
    tensor_rows: list[dict[str, Any]] = []
    peak = 0
    if mm.steps:
        sizes = mm.tensor_bytes_per_device(ctx)
        members = mm.members(mm.peak_live_set(ctx))
        peak = sum(sizes[i] for i in members)
        for i in members:
            t = mm.tensors[i]
            tensor_rows.append(
                {
                    "name": t.name,
                    "kind": t.kind,
                    "shape": str(t.shape),
                    "layout": layout_of(t.shape),
                    "bytes": sizes[i],
                    "share": sizes[i] / peak if peak else 0.0,
                }
            )
        tensor_rows.sort(key=lambda r: (-r["bytes"], r["name"]))
    return {
        "ops": op_rows[:max_rows],
        "ops_total": len(op_rows),
        "tensors": tensor_rows[:max_rows],
        "tensors_total": len(tensor_rows),
        "peak_bytes": peak,
    }


class DetailCache:
    """Plans never change: each plan's detail is computed once (LRU);
    ``computing`` is held while one is computed."""

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self.computing = threading.Lock()
        self._items: collections.OrderedDict[str, dict[str, Any]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, plan_id: str) -> dict[str, Any] | None:
        with self._lock:
            hit = self._items.get(plan_id)
            if hit is not None:
                self._items.move_to_end(plan_id)
            return hit

    def put(self, plan_id: str, detail: dict[str, Any]) -> None:
        with self._lock:
            self._items[plan_id] = detail
            while len(self._items) > self.size:
                self._items.popitem(last=False)

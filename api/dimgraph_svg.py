"""The dimension graph of a plan as an SVG picture (for the dashboard).

:func:`dimension_graph_layout` places the picture's parts; the template
``_dimgraph.svg`` draws them, so that every name is escaped by Jinja.

Nodes are dimension names, coloured by the mesh axis the plan split them over
(grey: kept whole; dashed outline: an op needs it whole).  Solid edges join
names that share a tensor (they can never share a mesh axis), dashed edges
names that only meet in an op.  Positions come from networkx's spring layout
with a fixed seed, so the same plan always draws the same picture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import networkx as nx

#: One colour per mesh axis, in mesh order (colour-blind-safe Okabe-Ito).
AXIS_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
WHOLE_COLOUR = "#BBBBBB"


def axis_colours(mesh_axes: list[str]) -> dict[str, str]:
    return {a: AXIS_COLOURS[i % len(AXIS_COLOURS)] for i, a in enumerate(mesh_axes)}


def dimension_graph_layout(
    dim_graph: Mapping[str, Any],
    rules: Mapping[str, str],
    mesh_axes: list[str],
    width: int = 640,
    height: int = 420,
) -> dict[str, Any] | None:
    """Where ``dim_graph``'s (the plan's ``dimension_graph``) nodes and edges
    go, each dim coloured by ``rules``; None when there are no nodes.

    >>> g = {"nodes": [{"name": "a", "sizes": [4]}, {"name": "b", "sizes": [2]}],
    ...      "edges": [{"a": "a", "b": "b", "kind": "tensor", "where": "t"}]}
    >>> out = dimension_graph_layout(g, {"a": "x"}, ["x"])
    >>> [(n["name"], n["axis"], n["fill"]) for n in out["nodes"]]
    [('a', 'x', '#0072B2'), ('b', '', '#BBBBBB')]
    """
    nodes = [n["name"] for n in dim_graph.get("nodes", [])]
    if not nodes:
        return None
    g = nx.Graph()
    g.add_nodes_from(nodes)
    for e in dim_graph.get("edges", []):
        g.add_edge(
            e["a"], e["b"], kind=e.get("kind", "tensor"), where=e.get("where", "")
        )
    pos = nx.spring_layout(g, seed=0, k=2.0 / math.sqrt(len(nodes)))
    pad = 60
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    span_x = (max(xs) - min(xs)) or 1.0
    span_y = (max(ys) - min(ys)) or 1.0

    def at(name: str) -> tuple[float, float]:
        x, y = pos[name]
        return (
            round(pad + (x - min(xs)) / span_x * (width - 2 * pad), 1),
            round(pad + (y - min(ys)) / span_y * (height - 2 * pad), 1),
        )

    colours = axis_colours(mesh_axes)
    info = {n["name"]: n for n in dim_graph.get("nodes", [])}
    edges = []
    for a, b, data in g.edges(data=True):
        (x1, y1), (x2, y2) = at(a), at(b)
        edges.append(
            {
                "x1": x1,
                "y1": y1,
                "x2": x2,
                "y2": y2,
                "dashed": data["kind"] == "op",
                "tip": f"{a} - {b}: {data['kind']} edge ({data['where']})",
            }
        )
    out_nodes = []
    for name in nodes:
        x, y = at(name)
        axis = rules.get(name) or ""
        node = info[name]
        whole_by = list(node.get("unsplittable_by") or [])
        sizes = "/".join(str(s) for s in node.get("sizes", []))
        out_nodes.append(
            {
                "name": name,
                "axis": axis,
                "x": x,
                "y": y,
                "fill": colours.get(axis, WHOLE_COLOUR) if axis else WHOLE_COLOUR,
                "needed_whole": bool(whole_by),
                "tip": f"{name} ({sizes}): "
                + (f"split over {axis}" if axis else "kept whole")
                + (f"; needed whole by {', '.join(whole_by[:3])}" if whole_by else ""),
            }
        )
    return {"width": width, "height": height, "nodes": out_nodes, "edges": edges}

"""The dimension graph of a plan as an SVG picture (for the dashboard).

Nodes are dimension names, coloured by the mesh axis the plan split them over
(grey: kept whole; dashed outline: an op needs it whole).  Solid edges join
names that share a tensor (they can never share a mesh axis), dashed edges
names that only meet in an op.  Positions come from networkx's spring layout
with a fixed seed, so the same plan always draws the same picture.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import networkx as nx

#: One colour per mesh axis, in mesh order (colour-blind-safe Okabe-Ito).
AXIS_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
WHOLE_COLOUR = "#BBBBBB"


def axis_colours(mesh_axes: list[str]) -> dict[str, str]:
    return {a: AXIS_COLOURS[i % len(AXIS_COLOURS)] for i, a in enumerate(mesh_axes)}


def dimension_graph_svg(
    dim_graph: Mapping[str, Any],
    rules: Mapping[str, str],
    mesh_axes: list[str],
    width: int = 640,
    height: int = 420,
) -> str:
    """An ``<svg>`` element (a string) drawing ``dim_graph`` (the plan's
    ``dimension_graph``) with each dim coloured by ``rules``."""
    nodes = [n["name"] for n in dim_graph.get("nodes", [])]
    if not nodes:
        return '<p class="muted">This plan has no dimension graph.</p>'
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
            pad + (x - min(xs)) / span_x * (width - 2 * pad),
            pad + (y - min(ys)) / span_y * (height - 2 * pad),
        )

    colours = axis_colours(mesh_axes)
    info = {n["name"]: n for n in dim_graph.get("nodes", [])}
    out = [
        f'<svg id="dim-graph" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="dimension graph">'
    ]
    for a, b, data in g.edges(data=True):
        (x1, y1), (x2, y2) = at(a), at(b)
        dash = ' stroke-dasharray="5,4"' if data["kind"] == "op" else ""
        tip = html.escape(f"{a} - {b}: {data['kind']} edge ({data['where']})")
        out.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="#888" stroke-width="1.5"{dash}><title>{tip}</title></line>'
        )
    for name in nodes:
        x, y = at(name)
        axis = rules.get(name)
        fill = colours.get(axis, WHOLE_COLOUR) if axis else WHOLE_COLOUR
        node = info[name]
        whole = bool(node.get("unsplittable_by"))
        sizes = "/".join(str(s) for s in node.get("sizes", []))
        tip = html.escape(
            f"{name} ({sizes}): "
            + (f"split over {axis}" if axis else "kept whole")
            + (
                f"; needed whole by {', '.join(node['unsplittable_by'][:3])}"
                if whole
                else ""
            )
        )
        outline = ' stroke-dasharray="3,2"' if whole else ""
        label = html.escape(name)
        out.append(
            f'<g class="dim-node" data-dim="{label}" data-axis="{html.escape(axis or "")}">'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="20" fill="{fill}" stroke="#333" '
            f'stroke-width="1.5"{outline}><title>{tip}</title></circle>'
            f'<text x="{x:.1f}" y="{y + 34:.1f}" text-anchor="middle" font-size="12">'
            f"{label}</text></g>"
        )
    out.append("</svg>")
    return "".join(out)

"""Refit a calibrated profile after the features changed, keeping its sweep.

A profile stores each sweep point's measured seconds and the features it was
fitted with, not its graph.  When ``cost_models.op_classes`` gains a feature,
the stored features are stale; this script rebuilds each point's graph from
``mtf_core.lowering.calibration_sweep`` (same name, mesh and rules), takes
its features again, merges the points of newer raw measurements
(``python -m mtf_core.lowering.calibrate --points ... --out raw.json``; a
point measured again replaces the old record), and fits the rates again with
``cost_models.calibration.fit_profile``.  The measured seconds are never
changed, and nothing but the sweep is fitted.

    .venv/bin/python bench/refit_profile.py bench/profiles/ci-host-cpu8.json \\
        --merge raw.json -o bench/profiles/ci-host-cpu8.json

It prints, per record, the features whose values changed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rebuilt(rec: dict[str, Any], devices: int) -> dict[str, Any]:
    """``rec`` with its graph rebuilt from the sweep point of its name."""
    from mtf_core.lowering.calibration_sweep import sweep_points
    from mtf_core.serialization import graph_to_dict

    points = {p.name: p for p in sweep_points(devices)}
    point = points.get(rec["point"])
    if point is None:
        raise SystemExit(
            f"sweep point {rec['point']!r} of the profile is not in the sweep "
            f"(known: {sorted(points)})"
        )
    mesh = point.mesh(devices)
    if (mesh, point.rules) != (rec["mesh_shape"], rec["layout_rules"]):
        raise SystemExit(
            f"sweep point {rec['point']!r} now runs on {mesh!r} under "
            f"{point.rules!r}; the profile measured it on {rec['mesh_shape']!r} "
            f"under {rec['layout_rules']!r}"
        )
    graph, outputs, _ = point.build(devices)
    out = dict(rec, graph=graph_to_dict(graph, outputs=outputs))
    out.pop("features", None)
    return out


def changed(old: dict[str, float], new: dict[str, float]) -> dict[str, Any]:
    """The features whose values differ between ``old`` and ``new``."""
    out = {}
    for f in sorted(set(old) | set(new)):
        a, b = old.get(f, 0.0), new.get(f, 0.0)
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            out[f] = (a, b)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile", help="calibrated profile JSON (with measured.sweep)")
    p.add_argument(
        "--merge",
        nargs="*",
        default=[],
        help="raw calibrate outputs whose sweep records to add (or replace)",
    )
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")
    args = p.parse_args()
    from cost_models.calibration import fit_profile

    profile = json.loads(Path(args.profile).read_text())
    measured = profile.get("measured") or {}
    devices = len(measured.get("devices") or []) or 8
    old = {(r["point"], r["backend"]): r for r in measured.get("sweep") or []}
    records = dict(old)
    for path in args.merge:
        raw = json.loads(Path(path).read_text())
        for r in raw["measured"]["sweep"]:
            records[(r["point"], r["backend"])] = r
    sweep = [r if "graph" in r else rebuilt(r, devices) for r in records.values()]
    fitted = fit_profile(dict(profile, measured=dict(measured, sweep=sweep)))
    for rec in fitted["measured"]["sweep"]:
        key = (rec["point"], rec["backend"])
        before = old.get(key)
        if before is None:
            print(f"{key[1]:9s} {key[0]:22s} new: {rec['seconds'] * 1e3:.2f} ms")
        elif diff := changed(before.get("features") or {}, rec["features"]):
            print(f"{key[1]:9s} {key[0]:22s} features changed: {diff}")
    for backend, report in sorted(fitted["measured"]["fit"].items()):
        errs = report["errors"]
        print(
            f"{backend}: {report['rows']} steps, largest error "
            f"{report['max_abs_error']:.0%}, {sum(abs(e) <= 0.2 for e in errs)} "
            "within 20%"
        )
    Path(args.output).write_text(json.dumps(fitted, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

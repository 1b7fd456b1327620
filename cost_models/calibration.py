"""Fitting a profile's per-op-class rates from measured steps.

A measured step is one row of a linear system: its features
(:func:`step_features`: the exact per-device counts of
:mod:`cost_models.op_classes`, summed over the ops and collectives the
lowering runs) times the unknown rates equals its measured seconds.
:func:`fit_rates` solves the rows by non-negative least squares on the
relative error (a 2 ms step counts as much as a 2 s one), pulled weakly
towards a prior (the roofline's rates, or the rates being refitted) so that a
feature no row exercises keeps its prior.

Two sources of rows, the same system:

* calibration: ``mtf_core.lowering.calibrate`` measures short graphs of one
  op class each (``measured.sweep`` in the profile JSON); :func:`fit_profile`
  fits one rate set per backend from them;
* runs: measured training steps of real plans (``POST /v1/measurements``,
  ``mtf-train --report``); :func:`refit` adds them to a profile's rows, so
  the next prediction moves towards what was measured.

>>> rows = [({"ops": 10.0}, 0.01), ({"ops": 20.0}, 0.02)]
>>> round(fit_rates(rows, {"ops": 1e-6})["ops"], 6)
0.001
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from cost_models.deferred import DeferredAllreduces
from cost_models.feature_names import FEATURES
from cost_models.gc_pause import gc_paused
from cost_models.hardware import (
    BACKENDS,
    PRESETS,
    Calibration,
    CostModelError,
    HardwareError,
    HardwareProfile,
)
from cost_models.layout_cache import LayoutSizes, layout_context
from cost_models.op_classes import (
    collective_features,
    op_features,
    roofline_rates,
)
from cost_models.op_costs import flops_per_device
from mtf_core.comm import CollectiveSpec
from mtf_core.graph import Graph, Tensor
from mtf_core.layout import LayoutRulesLike
from mtf_core.liveness import step_operations
from mtf_core.shapes import ShapeLike

#: Weight of the prior against one measured row (relative units), refitting
#: from a few measured runs: the profile's rates should mostly hold.
PRIOR_WEIGHT = 1e-3
#: The same for a calibration sweep, whose rows are made to pin every rate:
#: only a feature the rows leave undetermined keeps the prior.  (At 1e-3, a
#: rate the sweep measures 40 times its roofline prior, as a strided sum's,
#: cost as much pull as one and a half rows 60% off, and stayed well short.)
SWEEP_PRIOR_WEIGHT = 1e-5


def step_features(
    graph: Graph,
    mesh_shape: ShapeLike,
    layout_rules: LayoutRulesLike,
    outputs: Sequence[Tensor] = (),
) -> dict[str, float]:
    """The features of one step of ``graph`` under a layout: the compute
    features of every op the step runs (as ``evaluate`` takes them:
    :func:`mtf_core.liveness.step_operations`) and every collective's
    (deferred allreduces where the lowering forces them, exported outputs
    last), summed.  For a calibrated profile ``hw``,
    ``sum(hw.rates[f] * x)`` is ``evaluate(...).time_s``."""
    with gc_paused():
        ops = step_operations(graph, outputs)
        ctx = layout_context(graph, mesh_shape, layout_rules, ops)
        sizes = LayoutSizes(ctx)
        sim = DeferredAllreduces(ctx)
        axis_size = {d.name: d.size for d in ctx.mesh_shape}
        out: dict[str, float] = {}

        def add(feats: Iterable[tuple[str, float]]) -> None:
            for f, x in feats:
                out[f] = out.get(f, 0.0) + x

        specs: list[CollectiveSpec] = []
        for op in ops:
            specs.extend(i.spec for i in sim.step(op, op.communication(ctx)))
            add(op_features(op, ctx, sizes, flops_per_device(op, ctx, sizes)))
        for t in outputs:
            specs.extend(sim.force(t))
        for spec in specs:
            n = math.prod(axis_size[a] for a in spec.mesh_axes)
            add(collective_features(spec, n))
        return out


def predict_s(features: Mapping[str, float], rates: Mapping[str, float]) -> float:
    """Seconds the ``rates`` give a step with ``features``."""
    return sum(rates.get(f, 0.0) * x for f, x in features.items())


def fit_rates(
    rows: Sequence[tuple[Mapping[str, float], float]],
    prior: Mapping[str, float],
    prior_weight: float = PRIOR_WEIGHT,
    weights: Sequence[float] | None = None,
) -> dict[str, float]:
    """Non-negative rates minimizing the squared relative error of ``rows``
    (``(features, seconds)``) plus ``prior_weight`` times the squared relative
    distance to ``prior`` (which names every feature to fit) scaled by the
    one factor that fits the rows best.  ``weights`` (one per row, finite,
    >= 0, normalized to mean 1) weigh the rows' squared errors: by default
    each row counts the same."""
    names = sorted(prior)
    if not rows:
        return dict(prior)
    w = _row_weights(weights, len(rows))
    for feats, seconds in rows:
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds)):
            raise CostModelError(f"measured seconds {seconds!r}; expected a number")
        if seconds <= 0:
            raise CostModelError(f"measured seconds {seconds!r}; expected > 0")
        unknown = sorted(set(feats) - set(prior))
        if unknown:
            raise CostModelError(f"features {unknown} have no prior rate")
    # Scale each column by its prior so the unknowns are O(1) multipliers.
    scale = np.array([max(prior[f], 1e-30) for f in names])
    a = np.array([[feats.get(f, 0.0) for f in names] for feats, _ in rows])
    y = np.array([s for _, s in rows])
    a = a * scale / y[:, None]
    # Weighted least squares: each row (and its target of 1) times sqrt(w).
    b = np.sqrt(w)
    a = a * b[:, None]
    # First one common factor (closed form): a prior that is off by the same
    # factor everywhere (a roofline on a slower machine) is then pulled
    # towards the right magnitude, not towards its own.
    p = a.sum(axis=1)
    if float(p @ p) > 0:
        common = float(p @ b / (p @ p))
        if common > 0:
            scale = scale * common
            a = a * common
    # Imported here: scipy.optimize takes 0.4 s to import, and every program
    # that plans imports this module (through cost_models.profiles) but few fit.
    from scipy.optimize import lsq_linear

    reg = math.sqrt(prior_weight) * np.eye(len(names))
    sol = lsq_linear(
        np.vstack([a, reg]),
        np.concatenate([b, math.sqrt(prior_weight) * np.ones(len(names))]),
        bounds=(0.0, np.inf),
        method="bvls",
    )
    return {f: float(m * s) for f, m, s in zip(names, sol.x, scale)}


def _row_weights(weights: Sequence[float] | None, n: int) -> np.ndarray:
    if weights is None:
        return np.ones(n)
    w = np.array(
        [
            x if isinstance(x, (int, float)) and not isinstance(x, bool) else np.nan
            for x in weights
        ],
        dtype=float,
    )
    if len(w) != n:
        raise CostModelError(f"{len(w)} weights for {n} rows; expected one per row")
    bad = [x for x, ok in zip(weights, np.isfinite(w) & (w >= 0)) if not ok]
    if bad:
        raise CostModelError(f"row weight {bad[0]!r}; expected a finite number >= 0")
    if not w.sum() > 0:
        raise CostModelError("row weights are all 0; expected some > 0")
    normalized: np.ndarray = w / float(w.mean())
    return normalized


@dataclass(frozen=True)
class Measurement:
    """One measured step: the graph (JSON document, outputs included) or its
    precomputed ``known_features``, the layout, the backend and the fastest
    step's seconds."""

    graph: Mapping[str, Any] | None
    mesh_shape: str
    layout_rules: str
    backend: str
    seconds: float
    known_features: Mapping[str, float] | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Measurement:
        for key in ("mesh_shape", "layout_rules", "backend", "seconds"):
            if key not in d:
                raise CostModelError(f"measurement: missing key {key!r}")
        if d.get("graph") is None and d.get("features") is None:
            raise CostModelError("measurement: needs a 'graph' or its 'features'")
        if d["backend"] not in BACKENDS:
            raise CostModelError(
                f"measurement: backend {d['backend']!r}; expected one of {BACKENDS}"
            )
        feats = d.get("features")
        if feats is not None:
            unknown = sorted(set(feats) - set(FEATURES))
            if unknown:
                raise CostModelError(
                    f"measurement: unknown features {unknown}; expected among "
                    f"{list(FEATURES)}"
                )
        return cls(
            d.get("graph"),
            str(d["mesh_shape"]),
            str(d["layout_rules"]),
            str(d["backend"]),
            float(d["seconds"]),
            None if feats is None else {str(k): float(v) for k, v in feats.items()},
        )

    def features(self) -> dict[str, float]:
        if self.known_features is not None:
            return dict(self.known_features)
        from mtf_core.serialization import graph_from_dict

        loaded = graph_from_dict(self.graph)
        return step_features(
            loaded.graph, self.mesh_shape, self.layout_rules, loaded.outputs
        )


def rows_by_backend(
    measurements: Iterable[Measurement | Mapping[str, Any]],
) -> dict[str, list[tuple[dict[str, float], float]]]:
    """``{backend: [(features, seconds), ...]}`` of ``measurements``."""
    out: dict[str, list[tuple[dict[str, float], float]]] = {}
    for m in measurements:
        m = m if isinstance(m, Measurement) else Measurement.from_dict(m)
        out.setdefault(m.backend, []).append((m.features(), m.seconds))
    return out


def fit_profile(
    profile: Mapping[str, Any],
    extra: Iterable[Measurement | Mapping[str, Any]] = (),
    backend: str | None = None,
    keep_graphs: bool = False,
) -> dict[str, Any]:
    """``profile`` (a ``to_dict()``-style mapping with ``measured.sweep``)
    with per-backend rates fitted from its sweep plus ``extra`` measurements;
    ``measured.fit`` records each row's error (predicted / measured - 1).
    Each sweep record gets its ``features``; its ``graph`` is dropped unless
    ``keep_graphs``."""
    base = dict(profile)
    measured = dict(base.get("measured") or {})
    sweep = []
    for rec in measured.get("sweep") or []:
        # Keep each point's features beside it: the graph can then be dropped
        # (a model's JSON is large) and the profile still says what was fitted.
        rec = dict(rec)
        if rec.get("features") is None:
            rec["features"] = Measurement.from_dict(rec).features()
        if not keep_graphs:
            rec.pop("graph", None)
        sweep.append(rec)
    measured["sweep"] = sweep
    extra = [
        m if isinstance(m, Measurement) else Measurement.from_dict(m) for m in extra
    ]
    rows = rows_by_backend(list(sweep) + list(extra))
    if not rows:
        raise CostModelError(
            "fit_profile: no measurements (measured.sweep is empty and no extra "
            "measurements were given)"
        )
    base.pop("calibration", None)
    roof = roofline_rates(HardwareProfile.from_dict(base | {"measured": {}}))
    old = profile.get("calibration") or {}
    coefs: dict[str, dict[str, float]] = {}
    report: dict[str, Any] = {}
    for b, rs in sorted(rows.items()):
        prior = {**roof, **(old.get("coefficients", {}).get(b, {}))}
        rates = fit_rates(
            rs,
            {f: prior.get(f, 0.0) or roof[f] for f in FEATURES},
            SWEEP_PRIOR_WEIGHT,
        )
        coefs[b] = rates
        errs = [predict_s(f, rates) / s - 1.0 for f, s in rs]
        report[b] = {
            "rows": len(rs),
            "max_abs_error": max(abs(e) for e in errs),
            "errors": errs,
        }
    chosen = backend or ("placement" if "placement" in coefs else sorted(coefs)[0])
    base["calibration"] = {"backend": chosen, "coefficients": coefs}
    measured["fit"] = report
    base["measured"] = measured
    return base


def refit(
    hw: HardwareProfile | Mapping[str, Any] | str,
    measurements: Iterable[
        Measurement | Mapping[str, Any] | tuple[Mapping[str, float], float]
    ],
    prior_weight: float = PRIOR_WEIGHT,
    backend: str | None = None,
) -> HardwareProfile:
    """``hw`` with the rates of ``backend`` (default: the profile's) refitted from ``measurements``
    (:class:`Measurement` s, their dicts, or ``(features, seconds)`` rows of
    that backend), starting from its current rates (the roofline's for an
    uncalibrated profile such as ``cpu-host``).  Other backends keep theirs.
    ``hw`` given by name must be a preset; read a profile file with
    :func:`cost_models.profiles.get_hardware` first."""
    hw = _profile(hw)
    if backend is None:
        backend = _backend(hw)
    elif backend not in BACKENDS:
        raise CostModelError(f"backend {backend!r}; expected one of {BACKENDS}")
    if hw.calibration is not None and backend in dict(hw.calibration.coefficients):
        hw = hw.for_backend(backend)
    rows: list[tuple[Mapping[str, float], float]] = []
    for m in measurements:
        if isinstance(m, tuple):
            rows.append(m)
            continue
        m = m if isinstance(m, Measurement) else Measurement.from_dict(m)
        if m.backend == backend:
            rows.append((m.features(), m.seconds))
    roof = roofline_rates(hw)
    current = dict(hw.rates or {})
    prior = {f: current.get(f) or roof[f] for f in FEATURES}
    rates = fit_rates(rows, prior, prior_weight)
    old = dict(hw.calibration.coefficients) if hw.calibration is not None else {}
    coefs = {b: tuple(c) for b, c in old.items()}
    coefs[backend] = tuple(sorted(rates.items()))
    return replace(hw, calibration=Calibration(backend, tuple(sorted(coefs.items()))))


def _profile(hw: HardwareProfile | Mapping[str, Any] | str) -> HardwareProfile:
    if isinstance(hw, HardwareProfile):
        return hw
    if isinstance(hw, Mapping):
        return HardwareProfile.from_dict(hw)
    if hw in PRESETS:
        return PRESETS[hw]
    raise HardwareError(
        f"refit: hardware {hw!r} is not a preset name (expected one of "
        f"{sorted(PRESETS)}); for a profile file, pass "
        "cost_models.get_hardware(path)"
    )


def _backend(hw: HardwareProfile) -> str:
    return (
        hw.calibration.backend
        if isinstance(hw.calibration, Calibration)
        else "placement"
    )

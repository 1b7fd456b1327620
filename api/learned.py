"""Hardware profiles learned from measured steps, used by default.

A training run reports a plan's measured step (``POST /v1/measurements``);
:func:`refit_profile` refits the plan's hardware profile from every
measurement of that hardware on one lowering backend
(``cost_models.calibration.refit``: least squares on the per-op-class rates,
starting from the base profile's own rates).

:class:`LearnedProfiles` makes that the default: a plan or scale-plan request
that names a preset which has measurements on the request's backend is
planned with the refitted profile (unless the request says
``use_measurements: false``), and :class:`ProfileUsed` says which profile a
plan was made with.  Each replica keeps, in memory, the store's
*measurement stamps* (count and newest time per hardware and backend, one
cheap query) and the refit made for each stamp:

* the stamps are read when the service starts, after every measurement this
  replica stores, and at every heartbeat (``heartbeat_s``), so another
  replica's measurement is seen within one heartbeat;
* a refit is computed once per stamp, by the first request that needs it;
* :attr:`LearnedProfiles.epoch` (a digest of all stamps) salts the response
  cache's keys of exact request bytes, so bytes answered before a new
  measurement are parsed again after it rather than answered with the plan
  of the old profile.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from api.store.base import PlanRecord, Store, StoreUnavailable
from cost_models.calibration import Measurement, refit
from cost_models.hardware import PRESETS, CostModelError, HardwareProfile

log = logging.getLogger(__name__)

#: Measurements a refit reads (the newest), bounding its work.
MAX_REFIT_ROWS = 200

#: A measured step's seconds: from a microsecond (no framework runs a step
#: faster) to a million seconds.  Smaller ones overflow the refit's float
#: arithmetic (5e-324 s made every later plan on the preset a 500).
MIN_STEP_S, MAX_STEP_S = 1e-6, 1e6
#: How far a measured step may be from its plan's prediction (either way).
#: Priors are off by a few hundred at most (a tiny graph's framework
#: overhead); one measurement 10**10 times off made every later plan of the
#: preset "too slow for the planner" for every client.
MAX_MEASURED_FACTOR = 1e6

#: A hardware's measurements on one backend: (count, newest created_at).
Stamp = tuple[int, float]
#: A refitted profile and how many measurements it was fitted on.
Fit = tuple[HardwareProfile, int]

#: Where a plan's hardware profile came from.
BASE, REFITTED, REQUEST = "base", "refitted", "request"


@dataclass(frozen=True)
class ProfileUsed:
    """Which hardware profile a plan was made with.

    ``source`` is ``"base"`` (the preset as shipped: no measurements of it on
    ``backend``, or the request said ``use_measurements: false``),
    ``"refitted"`` (the preset refitted from ``measurements`` measured steps
    on ``backend``) or ``"request"`` (a whole profile object the request
    gave, used as given).
    """

    name: str
    backend: str
    source: str
    measurements: int = 0
    use_measurements: bool = True

    @property
    def text(self) -> str:
        if self.source == REFITTED:
            n = self.measurements
            return (
                f"{self.name} refitted from {n} measurement{'s' * (n != 1)} "
                f"on {self.backend}"
            )
        if self.source == REQUEST:
            return f"{self.name} as the request gave it"
        why = (
            "measurements not used (use_measurements: false)"
            if not self.use_measurements
            else f"no measurements on {self.backend}"
        )
        return f"{self.name} base profile ({why})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": self.backend,
            "source": self.source,
            "measurements": self.measurements,
            "use_measurements": self.use_measurements,
            "text": self.text,
        }


def plausible(measured_s: float, predicted_s: float) -> bool:
    """Whether a measured step is in range and within MAX_MEASURED_FACTOR of
    its prediction (a prediction of 0 s, from a calibration of zero rates,
    bounds nothing)."""
    if not MIN_STEP_S <= measured_s <= MAX_STEP_S:
        return False
    if not predicted_s > 0:
        return True
    ratio = measured_s / predicted_s
    return 1 / MAX_MEASURED_FACTOR <= ratio <= MAX_MEASURED_FACTOR


def profile_from_request(plan: PlanRecord) -> bool:
    """Whether ``plan`` was made with a whole profile its request gave."""
    return (plan.summary.get("profile") or {}).get("source") == REQUEST


def named_like_a_preset(plan: PlanRecord) -> bool:
    """Whether ``plan`` was made with a whole profile its request gave under
    a preset's name: its measurements say nothing of that preset, and must
    not refit it (for every client)."""
    return profile_from_request(plan) and plan.summary.get("hardware") in PRESETS


class GraphMissing(LookupError):
    """A measured plan's graph is not in the store."""


class _Features:
    """Step features of stored plans, remembered (a plan never changes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_plan: dict[str, dict[str, float]] = {}

    def of(self, store: Store, plan: PlanRecord) -> dict[str, float]:
        with self._lock:
            got = self._by_plan.get(plan.id)
        if got is None:
            doc = graph_doc(store, plan)
            p = plan.plan
            got = Measurement(
                doc, p["mesh_shape"], p["layout_rules"], "placement", 1.0
            ).features()
            with self._lock:
                if len(self._by_plan) > 4096:
                    self._by_plan.clear()
                self._by_plan[plan.id] = got
        return got


FEATURES = _Features()


def graph_doc(store: Store, plan: PlanRecord) -> dict[str, Any]:
    """The stored graph document of ``plan`` (GraphMissing if it is gone)."""
    text = store.get_graph(plan.graph_hash)
    if text is None:
        raise GraphMissing(f"the graph of plan {plan.id} is not stored")
    doc: dict[str, Any] = json.loads(text)
    return doc


def refit_profile(store: Store, hardware: str, backend: str) -> Fit | None:
    """The profile named ``hardware`` refitted from its newest measurements on
    ``backend``, and how many measurements the fit used; None without any.

    The fit starts from the preset of that name (its base profile), or, for a
    profile that is not a preset, from the one the newest measured plan was
    made with.  Left out: a measurement whose plan or graph is no longer
    stored, one of a plan made with a request's profile named like a preset
    (:func:`named_like_a_preset`), and one out of the range POST
    /v1/measurements accepts (the last two: stored before it checked them,
    :func:`plausible`).  A fit that
    fails on the numbers is a CostModelError naming the hardware."""
    records = store.list_measurements(
        hardware=hardware, backend=backend, limit=MAX_REFIT_ROWS
    )
    rows = []
    base = PRESETS[hardware].for_backend(backend) if hardware in PRESETS else None
    for m in records:
        if not plausible(m.measured_s, m.predicted_s):
            continue
        plan = store.get_plan(m.plan_id)
        if plan is None or named_like_a_preset(plan):  # the latter: stored
            continue  # before POST /v1/measurements refused it
        try:
            features = FEATURES.of(store, plan)
        except GraphMissing:
            continue
        if base is None:
            base = HardwareProfile.from_dict(plan.plan["hardware"]).for_backend(backend)
        rows.append((features, m.measured_s))
    if base is None or not rows:
        return None
    try:
        return refit(base, rows, backend=backend), len(rows)
    except (ArithmeticError, np.linalg.LinAlgError) as e:
        raise CostModelError(
            f"the {len(rows)} measurements of {hardware!r} on {backend!r} could "
            f"not be fitted: {e}"
        ) from None


class LearnedProfiles:
    """This replica's view of what the store's measurements teach: the
    stamps, and one refit per (hardware, backend) and stamp."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()  # stamps and fits
        self._refit_lock = threading.Lock()  # one refit at a time
        self._stamps: dict[tuple[str, str], Stamp] = {}
        self._fits: dict[tuple[str, str], tuple[Stamp, Fit | None]] = {}
        self.epoch = b""

    def refresh(self) -> bool:
        """Reads the store's measurement stamps; True if they changed."""
        stamps = self._store.measurement_stamps()
        text = json.dumps(sorted(stamps.items()), separators=(",", ":"))
        epoch = hashlib.sha256(text.encode()).digest()[:16]
        with self._lock:
            if stamps == self._stamps:
                return False
            self._stamps = stamps
            self.epoch = epoch
        return True

    def warm(self, hardware: str, backend: str) -> bool:
        """Whether :meth:`profile` answers from memory (no store read)."""
        key = (hardware, backend)
        with self._lock:
            stamp = self._stamps.get(key)
            fit = self._fits.get(key)
        return stamp is None or (fit is not None and fit[0] == stamp)

    def profile(self, hardware: str, backend: str) -> Fit | None:
        """The refitted profile of preset ``hardware`` on ``backend`` and its
        measurement count, or None when the store has no measurements of it."""
        key = (hardware, backend)
        with self._lock:
            stamp = self._stamps.get(key)
            fit = self._fits.get(key)
        if stamp is None:
            return None
        if fit is not None and fit[0] == stamp:
            return fit[1]
        with self._refit_lock:
            with self._lock:
                fit = self._fits.get(key)
            if fit is not None and fit[0] == stamp:
                return fit[1]  # made while this one waited
            try:
                got = refit_profile(self._store, hardware, backend)
            except StoreUnavailable:
                raise  # a moment's overload: the next request tries again
            except Exception:
                # Measurements no fit can be made of must not make every plan
                # of the preset fail: plan with the base profile (the log
                # says why), until the next measurement changes the stamp.
                log.exception(
                    "refitting %s on %s from its measurements failed; planning "
                    "with its base profile",
                    *key,
                )
                got = None
            with self._lock:
                self._fits[key] = (stamp, got)
            if got is not None:
                log.info("%s on %s refitted from %d measurements", *key, got[1])
            return got

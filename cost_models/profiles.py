"""Which hardware profile a ``hardware`` argument names.

Every entry point that takes ``hardware`` (:func:`cost_models.evaluate`, the
planner's options, the CLI) accepts a preset name, a
:class:`~cost_models.hardware.HardwareProfile`, a ``to_dict()`` mapping or the
path of a profile JSON file; :func:`get_hardware` turns each into a profile.
A file of raw measurements (what ``python -m mtf_core.lowering.calibrate``
writes: a sweep, no fitted rates) is fitted on read by
:func:`cost_models.calibration.fit_profile`, which is why this sits above
the calibration and not in :mod:`cost_models.hardware`.

>>> get_hardware("cpu-host").name
'cpu-host'
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from cost_models.calibration import fit_profile
from cost_models.hardware import PRESETS, HardwareError, HardwareProfile


def get_hardware(
    hardware: str | HardwareProfile | Mapping[str, Any],
) -> HardwareProfile:
    """A profile from a preset name, a profile, a ``to_dict()`` mapping, or the
    path of a JSON file holding one (what ``calibrate`` writes)."""
    if isinstance(hardware, HardwareProfile):
        return hardware
    if isinstance(hardware, Mapping):
        return HardwareProfile.from_dict(hardware)
    if isinstance(hardware, str):
        if hardware in PRESETS:
            return PRESETS[hardware]
        if hardware.endswith(".json") and os.path.isfile(hardware):
            with open(hardware) as f:
                try:
                    data = json.load(f)
                except json.JSONDecodeError as e:
                    raise HardwareError(
                        f"hardware profile file {hardware!r} is not JSON ({e}); "
                        "expected what HardwareProfile.to_dict() or calibrate writes"
                    ) from None
            if _needs_fit(data):
                # Raw measurements from ``python -m mtf_core.lowering.calibrate``
                # (which cannot import the cost model): fit the rates now.
                data = fit_profile(data)
            return HardwareProfile.from_dict(data)
        raise HardwareError(
            f"unknown hardware {hardware!r}; expected one of {sorted(PRESETS)}, a "
            "HardwareProfile, a profile dict or the path of a profile .json file"
        )
    raise HardwareError(
        f"hardware {hardware!r} is not a preset name, HardwareProfile or dict; "
        f"known presets: {sorted(PRESETS)}"
    )


def _needs_fit(data: object) -> bool:
    if not isinstance(data, Mapping):
        return False
    measured = data.get("measured")
    return (
        isinstance(measured, Mapping)
        and bool(measured.get("sweep"))
        and data.get("calibration") is None
    )

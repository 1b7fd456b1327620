"""The names of the features a calibrated profile has rates for.

What each feature counts is in :mod:`cost_models.op_classes`, which computes
them; the names live here so that :class:`~cost_models.hardware.Calibration`
can refuse a rate for a feature no op has (a misspelt feature would
otherwise be priced at nothing, silently).
"""

from __future__ import annotations

COMPUTE_CLASSES = (
    "matmul",
    "elementwise",
    "transcendental",
    "reduce",
    "gather",
    "random",
    "movement",
    "assign",
)
COLLECTIVE_KINDS = ("allreduce", "allconcat", "alltoall", "shift", "broadcast")
COMPUTE_FEATURES = (
    "ops",
    "matmul_flops",
    "large_bytes",
    "outer_reduce_bytes",
    "transpose_bytes",
) + (tuple(f"{c}_bytes" for c in COMPUTE_CLASSES))
COLLECTIVE_FEATURES = tuple(
    f"{k}_{t}" for k in COLLECTIVE_KINDS for t in ("bytes", "steps")
)
#: Every feature a calibrated profile has a rate for.
FEATURES = COMPUTE_FEATURES + COLLECTIVE_FEATURES

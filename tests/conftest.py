"""Shared fixtures.  TensorFlow-backed tests get 8 logical CPU devices.

TensorFlow is imported lazily so that pure-logic and solver tests never load it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

N_DEVICES = 8


@pytest.fixture(scope="session")
def devices() -> list[str]:
    """Eight logical CPU devices (the process's TF is configured once)."""
    import mtf_core as mtf

    return mtf.logical_devices(N_DEVICES)


@pytest.fixture
def rng() -> np.random.RandomState:
    return np.random.RandomState(0)

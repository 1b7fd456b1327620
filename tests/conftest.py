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


@pytest.fixture(autouse=True)
def _mtf_core_compat_off():
    """``import mtf_core.compat`` (at collection, by a test module) installs
    process-wide hooks: TF variable scopes in names and TF's initializers for
    layers' default weights.  Every test starts without them; a test that
    wants them calls ``mtf_core.compat.install()`` (and uninstalls)."""
    import sys

    compat = sys.modules.get("mtf_core.compat")
    if compat is not None:
        compat.uninstall()
    yield

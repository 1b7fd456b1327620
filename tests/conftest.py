"""Shared fixtures.  TensorFlow-backed tests get 8 logical CPU devices.

TensorFlow is imported lazily so that pure-logic and solver tests never load it.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's plain CPU allocator keeps no statistics, so
# tf.config.experimental.get_memory_info("CPU:0") raises where oneDNN is off
# (its default on CPUs without AVX-512, e.g. AMD EPYC hosts); the BFC
# allocator keeps them everywhere.  Tests that measure held bytes read them.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

N_DEVICES = 8


@pytest.fixture(scope="session")
def devices() -> list[str]:
    """Eight logical CPU devices (the process's TF is configured once)."""
    import mtf_core as mtf

    return mtf.logical_devices(N_DEVICES)


@pytest.fixture
def rng() -> np.random.RandomState:
    return np.random.RandomState(0)


def _uninstall_compat() -> None:
    import sys

    compat = sys.modules.get("mtf_core.compat")
    if compat is not None:
        compat.uninstall()


@pytest.fixture(autouse=True, scope="module")
def _mtf_core_compat_off_for_module_fixtures() -> None:
    """As below, before a module's own module-scoped fixtures: pytest makes
    those before any function-scoped fixture, so a model they build would
    otherwise take TF's initializers whenever a compat module was collected
    into the same process (tests/test_scale_pipeline_lowering.py's
    unpipelined and pipelined steps then started from different weights)."""
    _uninstall_compat()


@pytest.fixture(autouse=True)
def _mtf_core_compat_off():
    """``import mtf_core.compat`` (at collection, by a test module) installs
    process-wide hooks: TF variable scopes in names and TF's initializers for
    layers' default weights.  Every test starts without them; a test that
    wants them calls ``mtf_core.compat.install()`` (and uninstalls)."""
    _uninstall_compat()
    yield

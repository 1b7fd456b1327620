"""What a test does when a system service it needs (PostgreSQL, Chromium), or
a package of an optional extra (gin-config), is missing: skip, saying why, on
a developer's machine; fail in CI.

CI (``CI`` set to true/1/yes, as GitHub Actions and .ci/run do) installs those
services and every extra (``make test`` installs ``.[dev]``), so a missing one
there means the install broke, and a green run with the tests skipped would
hide it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """Whether the ``CI`` environment variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def service_missing(why: str) -> NoReturn:
    """Skips the test (or fixture) with ``why``, or fails it under CI."""
    if in_ci():
        pytest.fail(
            f"{why} (CI={os.environ['CI']}: a missing service is a failure)",
            pytrace=False,
        )
    pytest.skip(why)


def require_module(name: str, extra: str) -> ModuleType:
    """``import name``, or :func:`service_missing` naming the extra that
    installs it (``pytest.importorskip`` would skip in CI too)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        service_missing(f"{name} is not installed (the [{extra}] extra): {e}")

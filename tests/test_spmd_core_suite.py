"""The core's layout-independence tests, rerun on the SPMD backend.

Every test that lowers through ``tests/layout_cases.py`` (op families and their
gradients under the four standard layouts, the random-program property test,
compiled steps and checkpoints) runs again in a subprocess with
``LayoutCase.impl`` building a :class:`SimdMeshImpl`: eager lowerings run each
collective as a small SPMD program, compiled steps take the traced SPMD path.

This module is also the pytest plugin (``-p test_spmd_core_suite``) that does
the swap; as a test module its hooks are never registered.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.tf, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
TIMEOUT_S = 900


_built = {"meshes": 0, "compiled": 0}


def pytest_configure(config: Any) -> None:
    """Plugin hook: every LayoutCase builds an SPMD mesh implementation."""
    import layout_cases

    import mtf_core as mtf
    from mtf_core.lowering.spmd_compiled import SpmdCompiledFunction

    def impl(self: Any, devices: Any) -> Any:
        _built["meshes"] += 1
        return mtf.SimdMeshImpl(self.mesh_shape, self.rules, devices[: self.n_devices])

    init = SpmdCompiledFunction.__init__

    def counted_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _built["compiled"] += 1
        init(self, *args, **kwargs)

    layout_cases.LayoutCase.impl = impl
    SpmdCompiledFunction.__init__ = counted_init  # type: ignore[method-assign]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Plugin hook: says how much ran on the SPMD backend."""
    terminalreporter.write_line(
        f"spmd-meshes={_built['meshes']} spmd-compiled-steps={_built['compiled']}"
    )


def _core_test_files() -> list[str]:
    return sorted(
        str(p)
        for p in TESTS.glob("test_*.py")
        if p.name != Path(__file__).name and "layout_cases" in p.read_text()
    )


# Reruns the core suite in a subprocess: its own limit (TIMEOUT_S) applies,
# not the suite's per-test one.
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_core_layout_tests_pass_on_the_spmd_backend() -> None:
    files = _core_test_files()
    assert len(files) >= 5, files
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(TESTS), *filter(None, [env.get("PYTHONPATH")])]
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        Path(__file__).stem,
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        "not slow",
        "-W",
        "ignore",
        *files,
    ]
    run = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=TESTS.parent,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    built = re.search(r"spmd-meshes=(\d+) spmd-compiled-steps=(\d+)", run.stdout)
    assert built, run.stdout[-2000:]
    # the swap took: many meshes, and compiled steps on the traced SPMD path
    assert int(built.group(1)) > 100 and int(built.group(2)) > 5, built.group(0)
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed.group(1)) > 100, run.stdout[-2000:]

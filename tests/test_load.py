"""bench/load.py, briefly: a few clients for a few seconds of cached and new
plans against a real server, with zero errors.  (Speed is measured by the
benchmark itself, never asserted here.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.solver, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def test_short_load_run_has_no_errors():
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "load.py"),
        "--clients",
        "5",
        "--duration",
        "3",
    ]
    doc = ROOT / "docs" / "benchmarks.md"
    before = doc.read_text()
    out = subprocess.run(
        [*cmd, "--think-ms", "50", "--new-per-s", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "errors: 0;" in out.stdout
    assert doc.read_text() == before, "load.py rewrote the docs without --write"
    rows = {
        line.split("|")[1].strip(): line
        for line in out.stdout.splitlines()
        if line.startswith("| ")
    }
    cached = int(rows["cached plans"].split("|")[2])
    new = int(rows["new plans (solved)"].split("|")[2])
    assert cached > 0 and new > 0

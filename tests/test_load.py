"""bench/load.py, briefly: a few clients for a few seconds of cached and new
plans against real servers (one on SQLite; two replicas on PostgreSQL), with
zero errors, leaving the docs alone.  (Speed is measured by the benchmark
itself, never asserted here.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pg_server import pg_bindir
from services import service_missing

pytestmark = [pytest.mark.solver, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def run_load(*extra: str) -> dict[str, int]:
    """Runs bench/load.py briefly; returns each row's request count."""
    doc = ROOT / "docs" / "benchmarks.md"
    before = doc.read_text()
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "load.py"),
            "--clients",
            "5",
            "--duration",
            "3",
            "--think-ms",
            "50",
            "--new-per-s",
            "2",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "errors: 0;" in out.stdout
    assert doc.read_text() == before, "load.py rewrote the docs without --write"
    cells = [line.split("|") for line in out.stdout.splitlines()]
    return {
        row[1].strip(): int(row[2])
        for row in cells
        if len(row) > 2 and row[0] == "" and row[2].strip().isdigit()
    }


def test_short_load_run_has_no_errors():
    counts = run_load()
    assert counts["cached plans"] > 0 and counts["new plans (solved)"] > 0


def test_short_load_on_two_postgresql_replicas_has_no_errors():
    if pg_bindir() is None:
        service_missing("PostgreSQL is not installed (apt-get install postgresql)")
    counts = run_load(
        "--postgres",
        "--replicas",
        "2",
        "--other-bytes-share",
        "0.3",
        "--get-share",
        "0.2",
        "--list-share",
        "0.2",
    )
    kinds = ("cached, other bytes", "GET /v1/plans/{id}", "GET /v1/plans (list)")
    for kind in ("cached plans", *kinds):
        assert counts[kind] > 0, counts
    assert counts["new plans (solved)"] > 0

"""Helpers the benchmark scripts share: timing, markdown tables, and writing one
section of docs/benchmarks.md without touching the others.

Benchmarks measure; tests never assert speed.  Each script prints progress as
it goes and writes its results table, with the exact command that made it,
into its own ``## <Title>`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"

INTRO = """\
# Benchmarks

Numbers measured by the scripts under `bench/`, each in its own section with
the command that produced it.  Re-run a command to refresh its section; the
scripts rewrite only their own section.  Timings are wall-clock seconds on the
machine named in each section; they are for comparison on that machine, not
promises (the test suite never asserts speed).
"""


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)``."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (call it once before to
    leave warm-up out)."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def min_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls of ``fn``: on a shared machine, the
    estimate least disturbed by other processes."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; numbers right-aligned."""

    def cell(v: Any) -> str:
        return v if isinstance(v, str) else f"{v}"

    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if i else "---" for i in range(len(headers))) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_summary(extra: str = "") -> str:
    """One line naming the machine the numbers come from."""
    parts = [
        f"{platform.system()} {platform.machine()}",
        f"{os.cpu_count()} CPU cores",
        f"Python {platform.python_version()}",
    ]
    if extra:
        parts.append(extra)
    if hasattr(os, "nice") and os.nice(0) != 0:
        parts.append(f"run at niceness {os.nice(0)}")
    if hasattr(os, "getloadavg"):
        # Shared machines: say how busy it was, since wall times depend on it.
        parts.append(f"load average {os.getloadavg()[0]:.1f} when the run started")
    return ", ".join(parts)


def command_line() -> str:
    """The command that is running, as one copy-pasteable line."""
    script = os.path.relpath(sys.argv[0], ROOT)
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", script, *sys.argv[1:]])


def replace_section(title: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Writes ``## title`` with ``body`` into ``path``: replaces that section if
    present (up to the next ``## `` heading, or the ``<!-- BEGIN`` marker of a
    section another script writes), else appends it; creates the file with a
    short intro if missing."""
    text = path.read_text() if path.exists() else INTRO
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(
        rf"^## {re.escape(title)}[ \t]*\n.*?(?=^## |^<!-- BEGIN |\Z)",
        re.MULTILINE | re.DOTALL,
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

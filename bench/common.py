"""Helpers the benchmark scripts share: timing, markdown tables, and writing one
section of docs/benchmarks.md without touching the others.

Benchmarks measure; tests never assert speed.  Each script prints progress as
it goes and writes its results table, with the exact command that made it,
into its own section of docs/benchmarks.md, fenced by ``<!-- BEGIN key -->`` /
``<!-- END key -->`` markers (``replace_section``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

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


def child_json(
    code: str, args: Sequence[str], what: str, cwd: str | Path = ROOT
) -> Any:
    """Runs ``code`` in a fresh interpreter (``python -c code *args`` in
    ``cwd``) and returns the JSON its last line of output prints; a child that
    fails stops the benchmark, naming ``what`` and the end of its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def short_commit(rev: str) -> str | None:
    """``rev``'s short hash in this repository, or None if it names no commit."""
    got = subprocess.run(
        ["git", "rev-parse", "--short", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return got.stdout.strip() if got.returncode == 0 else None


def base_commit(rev: str) -> str:
    """An A/B bench's ``--base`` (an argparse ``type``): ``rev``'s short hash,
    or an error naming ``rev`` if it names no commit of this repository."""
    commit = short_commit(rev)
    if commit is None:
        raise argparse.ArgumentTypeError(f"{rev!r}: not a commit of this repository")
    return commit


@contextmanager
def commit_tree(commit: str) -> Iterator[str]:
    """A detached ``git worktree`` of ``commit`` in a temporary directory (its
    path), removed at the end: the tree an A/B bench runs as its base."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "base")
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", tree, commit],
            check=True, cwd=ROOT,
        )  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", tree], cwd=ROOT, check=False
            )


class Patching:
    """A bench's context that replaces attributes (:meth:`replace`, from its
    ``__enter__``) and puts each back as it was on exit."""

    def __init__(self) -> None:
        self._patches = ExitStack()

    def replace(self, owner: Any, name: str, new: Any) -> None:
        self._patches.enter_context(mock.patch.object(owner, name, new))

    def __exit__(self, *exc: object) -> None:
        self._patches.close()


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


def section_markers(key: str) -> tuple[str, str]:
    """The two HTML comments that fence the section ``key`` in the docs."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key):
        raise ValueError(
            f"section key must be lower-case words joined by '-', got {key!r}"
        )
    return f"<!-- BEGIN {key} -->", f"<!-- END {key} -->"


def replace_section(
    key: str, body: str, *, title: str | None = None, path: Path = BENCHMARKS_MD
) -> None:
    """Writes ``body`` between ``<!-- BEGIN key -->`` and ``<!-- END key -->`` in
    ``path`` (docs/benchmarks.md), headed by ``## title`` when one is given.

    Every benchmark script writes through this one function, so all sections
    share one marker scheme and a script can only ever replace the text inside
    its own markers: hand-written prose around them and the other scripts'
    sections are left as they are.  A section whose markers are missing is
    appended; the file is created with a short intro if missing."""
    begin, end = section_markers(key)
    text = path.read_text() if path.exists() else INTRO
    content = body.strip()
    if title is not None:
        content = f"## {title}\n\n{content}"
    block = f"{begin}\n{content}\n{end}"
    if text.count(begin) > 1 or text.count(end) > 1:
        raise ValueError(f"{path} holds the markers of section {key!r} more than once")
    if begin in text:
        if end not in text or text.index(end) < text.index(begin):
            raise ValueError(
                f"{path}: section {key!r} has {begin} without a later {end}"
            )
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

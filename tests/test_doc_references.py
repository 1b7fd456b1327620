"""The tests and benchmarks that README.md and docs/ cite exist.

The docs back each claim with a test or a benchmark command.  A test that is
renamed or removed would leave its claim pointing at nothing, so every cited
``tests/<file>.py``, ``bench/<file>.py`` and ``::<name>`` (a name in the
file cited just before it, as in ``tests/a.py::test_x`` or a later
``::test_y``) is looked up here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

_CITED = re.compile(
    r"((?:tests|bench)/[a-z_0-9/]+\.py)(?:::([A-Za-z_]\w*))?"
    r"|(?<![\w`])::([A-Za-z_]\w*)"
    r"|`::([A-Za-z_]\w*)"
)


def cited(text: str) -> list[tuple[str, str | None]]:
    """(file, name or None) for each citation in ``text``; a bare ``::name``
    belongs to the last test file cited before it."""
    out: list[tuple[str, str | None]] = []
    last: str | None = None
    for m in _CITED.finditer(text):
        path, name = m.group(1), m.group(2) or m.group(3) or m.group(4)
        if path is not None:
            out.append((path, name))
            if path.startswith("tests/"):
                last = path
        elif last is not None:
            out.append((last, name))
        else:
            out.append(("(no test file cited before)", name))
    return out


def test_citations_are_found_with_their_file():
    text = (
        "see tests/test_a.py::test_one and `::test_two`, (`::test_three`), "
        "bench/b.py, and C++'s std::vector"
    )
    assert cited(text) == [
        ("tests/test_a.py", "test_one"),
        ("tests/test_a.py", "test_two"),
        ("tests/test_a.py", "test_three"),
        ("bench/b.py", None),
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_cited_test_and_benchmark_exists(doc):
    missing = []
    for path, name in cited(doc.read_text()):
        source = ROOT / path
        if not source.is_file():
            missing.append(path)
        elif name is not None and not re.search(
            rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b",
            source.read_text(),
            re.M,
        ):
            missing.append(f"{path}::{name}")
    assert missing == []

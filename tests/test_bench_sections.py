"""docs/benchmarks.md has one writer: bench/common.py's ``replace_section``,
which replaces only the text between a section's own BEGIN/END markers."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402


def test_replace_section_rewrites_only_its_own_markers(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("# B\n\nintro prose\n")
    common.replace_section("lowering", "first", title="Lowering", path=doc)
    common.replace_section("mtf-auto", "| a |\n|---|", path=doc)
    doc.write_text(doc.read_text() + "\nprose after both\n")
    common.replace_section(
        "lowering", "second\n## not a section end", title="Lowering", path=doc
    )
    text = doc.read_text()
    assert text == (
        "# B\n\nintro prose\n\n"
        "<!-- BEGIN lowering -->\n## Lowering\n\nsecond\n## not a section end\n"
        "<!-- END lowering -->\n\n"
        "<!-- BEGIN mtf-auto -->\n| a |\n|---|\n<!-- END mtf-auto -->\n"
        "\nprose after both\n"
    )


def test_replace_section_refuses_broken_markers(tmp_path):
    doc = tmp_path / "b.md"
    doc.write_text("<!-- BEGIN x -->\nno end\n")
    with pytest.raises(ValueError, match="without a later"):
        common.replace_section("x", "body", path=doc)
    with pytest.raises(ValueError, match="section key"):
        common.replace_section("Not A Key", "body", path=doc)


def test_every_section_of_the_benchmarks_doc_is_fenced_once():
    text = common.BENCHMARKS_MD.read_text()
    begins = re.findall(r"^<!-- BEGIN ([a-z0-9-]+) -->$", text, re.M)
    ends = re.findall(r"^<!-- END ([a-z0-9-]+) -->$", text, re.M)
    assert begins == ends and len(set(begins)) == len(begins)
    for key in begins:
        assert text.index(f"<!-- BEGIN {key} -->") < text.index(f"<!-- END {key} -->")
    # Each key a script writes has its fence in the doc.
    written = set()
    for script in (ROOT / "bench").glob("*.py"):
        written |= set(
            re.findall(r'replace_section\(\s*"([a-z0-9-]+)"', script.read_text())
        )
    # (load.py and compare_mtf.py choose their keys at run time)
    assert {"lowering", "planner", "transformer", "spmd"} <= written
    # The sections measured so far are fenced (a new script's section is
    # appended, fenced, by its first run).
    assert {"lowering", "service", "planner", "transformer", "spmd"} <= set(begins)
    assert "mtf-auto" in begins  # compare_mtf.py's key is f"mtf-{mode}"


def test_no_bench_script_has_its_own_doc_writer():
    for script in (ROOT / "bench").rglob("*.py"):
        if script.name == "common.py":
            continue
        src = script.read_text()
        assert "def replace_section" not in src, script
        assert not re.search(r"benchmarks\.md.*write_text|DOC\.write_text", src), script

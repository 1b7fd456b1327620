"""The repository holds source, not binaries: `make lint` runs
.ci/large_files.py, and wheels are ignored."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _large_files_module():
    spec = importlib.util.spec_from_file_location(
        "large_files", ROOT / ".ci/large_files.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_tracked_file_is_over_one_mebibyte():
    assert _large_files_module().large_files(ROOT) == []


def test_large_file_check_flags_a_big_file_but_not_vendored_static(tmp_path):
    lf = _large_files_module()
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "api/static").mkdir(parents=True)
    (tmp_path / "api/static/bundle.js").write_bytes(b"x" * 2_000_000)
    (tmp_path / "tool.whl").write_bytes(b"x" * 2_000_000)
    (tmp_path / "small.py").write_text("x = 1\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "-f", "."], check=True)
    assert lf.large_files(tmp_path) == [("tool.whl", 2_000_000)]
    assert lf.large_files(tmp_path, max_bytes=1) == [
        ("small.py", 6),
        ("tool.whl", 2_000_000),
    ]


def test_wheels_are_ignored():
    out = subprocess.run(
        ["git", "check-ignore", "-q", "py_spy-0.4.3-py2.py3-none-any.whl"], cwd=ROOT
    )
    assert out.returncode == 0


def test_docs_cite_no_issue_numbers_readers_cannot_see():
    import re

    # "issue 14", "issues #3", "#14", "(the issue asks ...)": a tracker the
    # reader of the docs does not have.
    cite = re.compile(r"\bissues?\s*#?\d+|(?<![\w&])#\d+\b|\bthe issue\b", re.I)
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if cite.search(line)
    ]
    assert found == []

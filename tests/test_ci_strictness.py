"""The suite's own strictness: deprecations raised by our code fail, a missing
service fails under CI, unknown markers are errors, every test has a time limit."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from services import in_ci, service_missing

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "module", ["mtf_core.ops.einsum", "layout_planner", "api.main"]
)
def test_a_deprecation_warning_from_our_code_is_an_error(module):
    with pytest.raises(DeprecationWarning, match="old road"):
        warnings.warn_explicit("old road", DeprecationWarning, "x.py", 1, module=module)


def test_a_third_party_deprecation_warning_is_shown_not_raised():
    with pytest.warns(DeprecationWarning, match="old road"):
        warnings.warn_explicit(
            "old road", DeprecationWarning, "x.py", 1, module="numpy.x"
        )


@pytest.mark.parametrize("value", ["true", "1", "TRUE", "yes"])
def test_a_missing_service_fails_in_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match="PostgreSQL is not installed"):
        service_missing("PostgreSQL is not installed")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_a_missing_service_skips_outside_ci(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match="Chromium"):
        service_missing("Chromium is not installed")


def test_unknown_markers_are_errors_and_tests_have_a_time_limit(tmp_path):
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.slwo\ndef test_typo():\n    pass\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_x.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode != 0
    assert "'slwo' not found in `markers`" in out.stdout + out.stderr
    assert "timeout: 300.0s" in out.stdout


def test_the_summary_says_why_each_test_skipped(tmp_path):
    (tmp_path / "test_y.py").write_text(
        "import pytest\n\ndef test_gone():\n    pytest.skip('no frobnicator')\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_y.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:]
    assert "SKIPPED [1] test_y.py:4: no frobnicator" in out.stdout


def test_mypy_is_strict_on_every_package_with_the_pydantic_plugin():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert cfg["strict"] is True and "pydantic.mypy" in cfg["plugins"]
    assert set(cfg["files"]) == {"mtf_core", "cost_models", "layout_planner", "api"}
    # No module is exempt: no per-module overrides, no ignore_errors.
    assert "overrides" not in cfg and "ignore_errors" not in cfg


def test_a_missing_extra_package_fails_in_ci_and_skips_outside(monkeypatch):
    from services import require_module

    assert require_module("json", "none").dumps(1) == "1"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"the \[compat\] extra"):
        require_module("no_such_module_xyz", "compat")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="no_such_module_xyz"):
        require_module("no_such_module_xyz", "compat")

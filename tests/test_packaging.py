"""Dependencies by role (pyproject.toml): the language needs numpy only, the
planner and the service never pull TensorFlow, `dev` pulls every role."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = PROJECT["name"]


def _name(req: str) -> str:
    return re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower()


def _requirements(extra: str | None) -> set[str]:
    """Package names an install of ``.[extra]`` asks for, self-references
    (``mtf-planner[planner]``) followed."""
    reqs = list(PROJECT["dependencies"])
    todo = [extra] if extra else []
    seen: set[str] = set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for r in PROJECT["optional-dependencies"][e]:
            if _name(r) == NAME:
                todo.extend(re.search(r"\[(.*)\]", r).group(1).split(","))
            else:
                reqs.append(r)
    return {_name(r) for r in reqs}


def test_the_base_install_is_the_language_only():
    assert _requirements(None) == {"numpy"}


@pytest.mark.parametrize("extra", ["planner", "service"])
def test_planner_and_service_never_pull_tensorflow(extra):
    names = _requirements(extra)
    assert "ortools" in names
    assert not {n for n in names if n.startswith(("tensorflow", "tensorboard"))}


def test_roles_hold_what_their_code_imports():
    assert {"tensorflow-cpu", "tqdm"} <= _requirements("tf")
    assert {"fastapi", "httpx", "psycopg", "uvicorn"} <= _requirements("service")
    assert "scikit-learn" in _requirements("examples")


def test_dev_pulls_every_role():
    dev = _requirements("dev")
    for extra in ("planner", "tf", "service", "examples"):
        assert _requirements(extra) <= dev, extra
    assert {"pytest-timeout", "import-linter", "mypy"} <= dev


def test_the_mnist_network_is_a_library_model_the_service_exports():
    # api.examples builds it from mtf_core.models, not from examples/ by path,
    # and without TensorFlow.
    code = """
import sys
from api.examples import example_graph
from mtf_core.models import build_mnist
doc = example_graph("mnist", batch=16, hidden=32)
assert doc["metadata"]["name"] == "mnist", doc["metadata"]
m = build_mnist(batch_size=16, hidden_size=32)
assert len(doc["operations"]) == len(m.graph.operations)
print(sorted(n for n in ("tensorflow", "mtf_examples_mnist") if n in sys.modules))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"

"""The service image's recipe: the Dockerfile installs the service extra under
the pinned constraints, which hold every package the extra needs and no
TensorFlow; the health check is the liveness endpoint."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints-service.txt"


def _name(requirement: str) -> str:
    return (
        re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
    )


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"{line!r} in {CONSTRAINTS.name} is not pinned with =="
            pins[_name(name)] = version
    return pins


def _service_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names: set[str] = set()
    todo = ["service"]
    while todo:
        for req in extras[todo.pop()]:
            if _name(req) == "mtf-planner":  # mtf-planner[planner]: another extra
                todo.extend(re.findall(r"\[(.*)\]", req)[0].split(","))
            else:
                names.add(_name(req))
    return names | {_name(r) for r in project["dependencies"]}


def test_constraints_pin_every_service_package_and_no_tensorflow():
    pins = _pins()
    missing = sorted(_service_requirements() - set(pins))
    assert missing == [], f"{CONSTRAINTS.name} lacks {missing}; regenerate it"
    assert not {n for n in pins if n.startswith(("tensorflow", "tensorboard", "keras"))}
    assert {"fastapi", "ortools", "uvicorn", "psycopg-pool"} <= set(pins)


def test_dockerfile_installs_the_service_extra_under_the_constraints():
    text = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install ([^\n\\&]+)", text)
    assert installs == ["--constraint constraints-service.txt '.[service]' "]
    assert "COPY constraints-service.txt" in text
    health = re.search(r"HEALTHCHECK .*\n\s*CMD (.*)", text)
    assert health is not None and "/healthz" in health.group(1)
    assert re.search(r'CMD \["mtf-planner", "serve", "--host", "0.0.0.0"', text)
    assert "--insecure" not in text.split("CMD [")[-1]  # tokens are required


def test_dockerfile_copies_only_what_the_service_install_needs():
    # The installed packages (setuptools' include list) and the files pip
    # reads; examples/ is not among them: `mtf-planner export --model mnist`
    # builds the network from mtf_core.models.
    text = (ROOT / "Dockerfile").read_text()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {p.rstrip("*") for p in cfg["packages"]["find"]["include"]}
    copied = [line.split()[1:-1] for line in re.findall(r"^COPY .*$", text, re.M)]
    sources = {s for srcs in copied for s in srcs}
    assert sources == packages | {
        "constraints-service.txt",
        "pyproject.toml",
        "README.md",
    }
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "examples" in ignored and not packages & set(ignored)

# make run  : set everything up and start the main job
# make test : set everything up and run lint and the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint setup clean bench bench-venv-mtf

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(PY) examples/mnist.py --mesh_shape "rows:2;cols:2" --layout "batch:rows;hidden:cols"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: lint
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/pytest -n 2 --dist loadfile -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache

# Separate environment with Mesh TensorFlow 0.1.21 from PyPI, for side-by-side
# benchmarks only (bench/compare_mtf.py).  Never used by the product or tests.
.venv-mtf/.installed-stamp:
	$(PYTHON) -m venv .venv-mtf
	.venv-mtf/bin/pip install -q --upgrade pip
	.venv-mtf/bin/pip install -q "tensorflow-cpu==2.21.*" "ortools==9.15.*" "protobuf==6.33.*" "mesh-tensorflow==0.1.21"
	touch $@

bench-venv-mtf: .venv-mtf/.installed-stamp

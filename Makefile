# make run  : set everything up and start the main job
# make test : set everything up and run lint and the whole test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: run test lint setup clean bench bench-venv-mtf conformance

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# An editable install compiles none of the project's modules; where
	# PYTHONDONTWRITEBYTECODE is set (as on this project's machines), every fresh
	# interpreter (a service worker, a search helper, a test's subprocess)
	# would compile them from source again.  A module edited since is
	# compiled again on import, as without this.
	$(PY) -m compileall -q mtf_core cost_models layout_planner api conformance >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# The planner service on 127.0.0.1, its store seeded with plans for the example
# models (seeding again finds them stored and solves nothing).
PLANNER_DATA ?= data/planner
PLANNER_PORT ?= 8080
run: $(STAMP)
	$(VENV)/bin/mtf-planner seed --data-dir $(PLANNER_DATA)
	@echo "Dashboard: http://127.0.0.1:$(PLANNER_PORT)/  (API docs: http://127.0.0.1:$(PLANNER_PORT)/docs)"
	$(VENV)/bin/mtf-planner serve --host 127.0.0.1 --port $(PLANNER_PORT) --data-dir $(PLANNER_DATA)

lint: $(STAMP)
	$(PY) .ci/large_files.py
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: lint
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/pytest -n 2 --dist loadfile -q

# Mesh TensorFlow 0.1.21's own tests (from its PyPI wheel, unpacked under
# .cache/) run on mtf_core; prints a table and "N passed, M failed", and fails
# if fewer than CONFORMANCE_MIN pass.  See docs/compatibility.md.
CONFORMANCE_MIN ?= 0
$(VENV)/.compat-stamp: pyproject.toml $(STAMP)
	$(PY) -m pip install -q -e '.[dev,compat]'
	touch $@

conformance: $(VENV)/.compat-stamp
	TF_CPP_MIN_LOG_LEVEL=2 $(PY) -m conformance --min-passed $(CONFORMANCE_MIN)
	TF_CPP_MIN_LOG_LEVEL=2 $(VENV)/bin/pytest -q -n 0 tests/test_compat_transformer.py

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

# Two entry points: `make demo` (set up, then run the main job) and `make test` (set up, lint, test).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export CBO_HOME ?= $(HOME)/.cache/cbo

.PHONY: demo test venv setup lint format clean bench docs

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first, pinned: the CPU wheel of this machine; an unpinned torch would pull a CUDA build
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet -e ".[all,dev,docs]"
	touch $(STAMP)

venv: $(STAMP)

setup: $(STAMP)
	$(VENV)/bin/cbo setup

demo: setup
	$(VENV)/bin/cbo demo

lint: $(STAMP)
	$(VENV)/bin/ruff check cbo tests benchmarks
	$(VENV)/bin/ruff format --check cbo tests benchmarks

format: $(STAMP)
	$(VENV)/bin/ruff format cbo tests benchmarks
	$(VENV)/bin/ruff check --fix cbo tests benchmarks

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: setup lint
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info

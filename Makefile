# Quick start: `make demo` and `make test`. Both go through `make setup`, which is idempotent.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tandem-setup
# The CPU build of torch lies on these machines' disk; a plain `torch` would pull a CUDA build.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# pytest workers: one per core of the 2-core CI machine (each loads the model: ~5 GB a worker); 0 runs serially
PYTEST_WORKERS ?= 2

.PHONY: setup demo test test-gpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/tandem fetch --datasets
	touch $(STAMP)

demo: setup
	$(BIN)/tandem demo

test: setup
	$(BIN)/python -m protos.generate --check
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests --ignore=tests/gpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

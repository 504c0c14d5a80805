# Quick start: `make demo` and `make test`. Both go through `make setup`, which is idempotent.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tandem-setup
GPU_STAMP := $(VENV)/.tandem-setup-gpu
# The CPU build of torch lies on these machines' disk; a plain `torch` would pull a CUDA build.
# On a GPU machine pick a CUDA build (README.md, "On a GPU"), e.g.
#   make test-gpu TORCH_SPEC=torch==2.11.0 TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=
# pytest workers: one per core of the 2-core CI machine (each loads the model: ~5 GB a worker); 0 runs serially
PYTEST_WORKERS ?= 2

.PHONY: setup setup-gpu demo test test-gpu clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/tandem fetch --datasets
	touch $(STAMP)

# the gpu extra (flashinfer) on top of setup, once torch has shown it sees a GPU
setup-gpu: $(GPU_STAMP)

$(GPU_STAMP): $(STAMP)
	$(BIN)/python -m tests.gpu.require_cuda
	$(BIN)/python -m pip install -q -e ".[dev,gpu]"
	touch $(GPU_STAMP)

demo: setup
	$(BIN)/tandem demo

test: setup
	$(BIN)/python -m protos.generate --check
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile tests --ignore=tests/gpu $(PYTEST_ARGS)

# tests/gpu on this machine's GPU; without CUDA it stops with what to install, rather than skip every test
test-gpu: setup-gpu
	$(BIN)/python -m tests.gpu.require_cuda
	$(BIN)/python -m pytest -q tests/gpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

"""The Makefile's targets do what the README says: `make test-gpu` checks for CUDA first, then runs tests/gpu."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_gpu_runs_the_gpu_tests_once_cuda_is_there():
    plan = subprocess.run(["make", "-n", "test-gpu"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = plan.splitlines()
    check = max(i for i, line in enumerate(lines) if "-m tests.gpu.require_cuda" in line)
    run = next(i for i, line in enumerate(lines) if "-m pytest" in line and "tests/gpu" in line)
    assert check < run
    assert any('".[dev,gpu]"' in line for line in lines)  # flashinfer, the gpu extra


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_make_test_gpu_stops_with_what_to_install():
    proc = subprocess.run([sys.executable, "-m", "tests.gpu.require_cuda"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "the GPU tests need CUDA" in proc.stderr and "CUDA build of torch" in proc.stderr
    assert 'README.md, "On a GPU"' in proc.stderr

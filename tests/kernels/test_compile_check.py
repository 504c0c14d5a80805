"""The layer kernels compile for the H100 (sm_90) on a machine without a GPU: what the interpreter
tests cannot show (the compiled path of a kernel, its lowering, ptxas)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_layer_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "kernels.compile_check", "90"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 54 and all("sm_90 ok" in line for line in lines), proc.stdout

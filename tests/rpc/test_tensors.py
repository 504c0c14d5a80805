"""rpc.tensors: what crosses the wire round-trips, and a client sending token lists never loads torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from rpc import tensors


def test_a_load_client_builds_its_requests_without_torch():
    # bench-serve's load processes build every request before the load starts; torch came lazily with the first
    # one (rpc.tensors imported it), seconds of CPU inside the timed region on a GPU machine
    code = ("import sys; import bench.serve_load as s; "
            "s._generate_request(s.Load('grpc', 'localhost:1', 16, temperature=0.7), [1, 2, 3], 0); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float16", "bfloat16", "uint8"])
def test_torch_tensors_round_trip(dtype):
    value = torch.arange(6).reshape(2, 3).to(getattr(torch, dtype))
    back = tensors.to_torch(tensors.encode(value), "f")
    assert back.dtype == value.dtype and torch.equal(back, value)


def test_lists_and_numpy_round_trip_and_a_bad_dtype_is_named():
    assert tensors.token_ids(tensors.encode([5, 6, 7], "int32"), "ids") == [5, 6, 7]
    arr = np.arange(4, dtype=np.float32)
    assert np.array_equal(tensors.to_numpy(tensors.encode(arr), "x"), arr)
    with pytest.raises(ValueError, match="prompt: dtype 'float32' is not one of int32, int64"):
        tensors.token_ids(tensors.encode(arr), "prompt")
    with pytest.raises(ValueError, match="cannot cross the wire"):
        tensors.encode(torch.zeros(2, dtype=torch.complex64))

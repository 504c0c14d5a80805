"""The row argmax split across programs (kernels/argmax_rows.py) under the Triton interpreter, against torch."""

from __future__ import annotations

import pytest
import torch

from kernels.argmax_rows import BLOCK, argmax_rows, argmax_rows_reference


@pytest.mark.parametrize("rows,vocab", [(1, 49152), (5, 49152), (3, 1), (2, BLOCK + 1), (4, 3 * BLOCK), (0, 7)])
def test_argmax_and_exponential_race_equal_torch(rows, vocab):
    g = torch.Generator().manual_seed(rows * vocab)
    x = torch.randn(rows, vocab, generator=g)
    noise = torch.empty(rows, vocab).exponential_(generator=g)
    assert torch.equal(argmax_rows(x), argmax_rows_reference(x))
    assert torch.equal(argmax_rows(x, noise), argmax_rows_reference(x, noise))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_rows_as_an_lm_head_leaves_them_equal_their_float32_argmax(dtype):
    """The engine's greedy picks read the LM head's output in the model's dtype (no float32 copy): the
    same index as the float32 logits, ties included (16-bit rounding makes many)."""
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(4, 3 * BLOCK + 7, generator=g) * 4).to(dtype)
    x[1, [11, BLOCK + 3]] = x[1].max() + 1  # a tie across programs, in 16 bits
    noise = torch.empty(x.shape).exponential_(generator=g)
    assert torch.equal(argmax_rows(x), argmax_rows_reference(x.float()))
    assert argmax_rows(x)[1].item() == 11
    assert torch.equal(argmax_rows(x, noise), argmax_rows_reference(x.float(), noise))


def test_ties_go_to_the_first_index_across_programs_and_infinite_rows_to_zero():
    x = torch.zeros(4, 3 * BLOCK)
    x[0, [BLOCK + 5, 2 * BLOCK + 1]] = 2.0     # a tie in two programs: the lower index
    x[1, [7, 9]] = 1.0                          # a tie in one program
    x[2] = float("-inf")                        # no finite value: index 0, as torch
    x[3, -1] = float("inf")                     # the last column of the last program
    assert argmax_rows(x).tolist() == argmax_rows_reference(x).tolist() == [BLOCK + 5, 7, 0, 3 * BLOCK - 1]


def test_zero_probabilities_never_win_the_race_and_strided_rows_are_read_in_place():
    buf = torch.rand(3, 3 * BLOCK + 10)
    probs = buf[:, 10:]                        # rows of a wider buffer
    probs[:, ::2] = 0.0
    noise = torch.full_like(probs, 1e-30)      # tiny noise would make any zero-probability id win if it counted
    got = argmax_rows(probs, noise)
    assert torch.equal(got, argmax_rows_reference(probs, noise)) and (got % 2 == 1).all()


BAD = {
    "x_dtype": (dict(x=torch.zeros(2, 3, dtype=torch.float64)), "x"),
    "x_rank": (dict(x=torch.zeros(6)), "x"),
    "x_empty_rows": (dict(x=torch.zeros(2, 0)), "x"),
    "x_strided_columns": (dict(x=torch.zeros(3, 2).t()), "x"),
    "noise_shape": (dict(noise=torch.ones(2, 4)), "noise"),
    "noise_dtype": (dict(noise=torch.ones(2, 3, dtype=torch.float64)), "noise"),
}


@pytest.mark.parametrize("kwargs,name", BAD.values(), ids=BAD.keys())
def test_wrapper_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        argmax_rows(**{"x": torch.zeros(2, 3), **kwargs})

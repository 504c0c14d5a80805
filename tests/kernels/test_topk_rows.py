"""The row top-b split across programs (kernels/topk_rows.py: a draft tree's children) under the Triton interpreter,
against a stable descending sort."""

from __future__ import annotations

import pytest
import torch

from kernels.argmax_rows import argmax_rows
from kernels.topk_rows import BLOCK, topk_rows, topk_rows_reference


@pytest.mark.parametrize("rows,vocab,b", [(1, 49152, 2), (5, 49152, 3), (2, BLOCK + 1, 4), (4, 3 * BLOCK, 1),
                                          (3, 2, 2), (0, 7, 2)])
def test_top_b_equals_a_stable_sort_and_its_first_is_the_argmax(rows, vocab, b):
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows * vocab + b))
    got = topk_rows(x, b)
    assert got.shape == (rows, b) and torch.equal(got, topk_rows_reference(x, b))
    assert torch.equal(got[:, 0], argmax_rows(x))


def test_ties_go_to_the_lowest_index_within_and_across_programs_in_16_bits():
    x = (torch.randn(3, 3 * BLOCK + 5, generator=torch.Generator().manual_seed(2)) * 4).to(torch.bfloat16)
    top = x.max() + 1
    x[0, [2 * BLOCK + 1, 9, BLOCK + 3]] = top     # three equal best in three programs
    x[1, [5, 6]] = top                            # two in one program
    x[1, 3 * BLOCK + 4] = top + 1                 # the last column of the last (short) program, alone on top
    x[2] = float("-inf")                          # nothing finite: the lowest indices
    got = topk_rows(x, 3)
    assert torch.equal(got, topk_rows_reference(x, 3))
    assert got.tolist()[0] == [9, BLOCK + 3, 2 * BLOCK + 1]
    assert got.tolist()[1][:3] == [3 * BLOCK + 4, 5, 6] and got.tolist()[2] == [0, 1, 2]


BAD = {
    "x_dtype": (dict(x=torch.zeros(2, 3, dtype=torch.float64)), "x"),
    "x_rank": (dict(x=torch.zeros(6)), "x"),
    "x_strided_columns": (dict(x=torch.zeros(3, 2).t()), "x"),
    "b_zero": (dict(b=0), "b"),
    "b_past_the_columns": (dict(b=4), "b"),
}


@pytest.mark.parametrize("kwargs,name", BAD.values(), ids=BAD.keys())
def test_wrapper_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        topk_rows(**{"x": torch.zeros(2, 3), "b": 2, **kwargs})

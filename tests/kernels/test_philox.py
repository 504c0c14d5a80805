"""Counter-based random rows (kernels/philox.py) under the Triton interpreter, against the torch
reference; the reference against Philox4x32-10's published known answers; the numbers' spread."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sampling import coins
from kernels.philox import random_rows
from kernels.philox_ref import philox_reference, random_rows_reference

# Random123's known-answer vectors (kat_vectors, philox4x32 10 rounds): key, counter -> first output word
KAT = [
    ((0, 0), (0, 0, 0, 0), 0x6627E8D5),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF,) * 4, 0x408F276D),
    ((0xA4093822, 0x299F31D0), (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), 0xD16CFE09),
]

SEEDS = torch.tensor([0, 1, 12345, 2**63 - 1, 2**40 + 7])
COUNTERS = torch.tensor([0, 1, 5, 2**33 + 3, 77])


@pytest.mark.parametrize("key,counter,word", KAT)
def test_reference_matches_the_published_known_answers(key, counter, word):
    t = [torch.tensor(x) for x in (*key, *counter)]
    assert philox_reference(*t).item() == word


@pytest.mark.parametrize("stream", [0, 1, 2, 7])
@pytest.mark.parametrize("col0,cols", [(0, 1), (0, 3000), (5 * 1024 + 3, 1100)])
def test_kernel_uniforms_equal_the_reference_bit_for_bit(stream, col0, cols):
    out = random_rows(torch.empty(len(SEEDS), cols), SEEDS, COUNTERS, stream, col0)
    assert torch.equal(out, random_rows_reference(SEEDS, COUNTERS, stream, cols, col0))


def test_kernel_exponentials_match_the_reference_and_fill_strided_rows():
    # rows of a wider buffer (the fused round's noise rows): only the view is written
    buf = torch.full((len(SEEDS), 2500), -1.0)
    out = random_rows(buf[:, 100:2100], SEEDS, COUNTERS, 1, exponential=True)
    torch.testing.assert_close(out, random_rows_reference(SEEDS, COUNTERS, 1, 2000, exponential=True),
                               rtol=1e-6, atol=1e-6)
    assert (buf[:, :100] == -1).all() and (buf[:, 2100:] == -1).all()


def test_a_row_depends_only_on_its_seed_counter_stream_and_column():
    full = random_rows_reference(SEEDS, COUNTERS, 0, 64)
    for i in range(len(SEEDS)):  # alone, or at a column offset, a row reads the same numbers
        assert torch.equal(random_rows_reference(SEEDS[i:i + 1], COUNTERS[i:i + 1], 0, 64)[0], full[i])
        assert torch.equal(random_rows_reference(SEEDS[i:i + 1], COUNTERS[i:i + 1], 0, 32, col0=32)[0], full[i, 32:])
    # and any of the four changes every number (up to chance equality of 23-bit values)
    base = random_rows_reference(SEEDS[:1], COUNTERS[:1], 0, 4096)
    for other in (random_rows_reference(SEEDS[:1] + 1, COUNTERS[:1], 0, 4096),
                  random_rows_reference(SEEDS[:1], COUNTERS[:1] + 1, 0, 4096),
                  random_rows_reference(SEEDS[:1], COUNTERS[:1], 1, 4096),
                  random_rows_reference(SEEDS[:1], COUNTERS[:1], 0, 4096, col0=1)):
        assert (other == base).float().mean() < 0.01


def test_uniforms_and_exponentials_have_their_distributions():
    n = 1 << 20
    u = random_rows_reference(torch.tensor([3, 4]), torch.tensor([0, 9]), 0, n // 2).flatten().double()
    assert 0 < u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 1e-3
    # Kolmogorov-Smirnov against U(0, 1): the 0.1 % critical value is 1.95 / sqrt(n)
    s = u.sort().values
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    assert (grid - s).abs().max() < 1.95 / math.sqrt(n)
    # neighbouring columns and neighbouring draws are uncorrelated
    rows = random_rows_reference(torch.tensor([5, 5]), torch.tensor([0, 1]), 0, n // 2).double() - 0.5
    for a, b in ((rows[0, :-1], rows[0, 1:]), (rows[0], rows[1])):
        assert abs((a * b).mean() / (1 / 12)) < 5 / math.sqrt(n / 2)
    e = random_rows_reference(torch.tensor([6]), torch.tensor([2]), 1, n, exponential=True).double()
    assert e.min() > 0 and torch.isfinite(e).all()
    assert abs(e.mean() - 1) < 4 / math.sqrt(n) and abs(e.var() - 1) < 0.02


def test_engine_fill_draws_the_reference_off_cuda():
    out = coins.fill(torch.empty(len(SEEDS), 70), SEEDS, COUNTERS, coins.Stream.DRAFT, col0=7, exponential=True)
    assert torch.equal(out, random_rows_reference(SEEDS, COUNTERS, int(coins.Stream.DRAFT), 70, 7, True))
    drawn = coins.draw(SEEDS.tolist(), COUNTERS.tolist(), 70, coins.Stream.DRAFT, torch.device("cpu"), 7, True)
    assert torch.equal(drawn, out)


BAD = {
    "out_dtype": (dict(out=torch.empty(2, 3, dtype=torch.float64)), "out"),
    "out_rank": (dict(out=torch.empty(6)), "out"),
    "out_columns_strided": (dict(out=torch.empty(3, 2).t()), "out"),
    "seeds_dtype": (dict(seeds=torch.zeros(2, dtype=torch.int32)), "seeds"),
    "counters_shape": (dict(counters=torch.zeros(3, dtype=torch.long)), "counters"),
    "stream_negative": (dict(stream=-1), "stream"),
    "col0_type": (dict(col0=1.5), "col0"),
    "col0_too_large": (dict(col0=2**31), "stream"),
}


@pytest.mark.parametrize("kwargs,name", BAD.values(), ids=BAD.keys())
def test_wrapper_rejects_bad_arguments(kwargs, name):
    args = dict(out=torch.empty(2, 3), seeds=torch.zeros(2, dtype=torch.long), counters=torch.zeros(2, dtype=torch.long),
                stream=0, col0=0)
    with pytest.raises(ValueError, match=rf"^{name} "):
        random_rows(**{**args, **kwargs})

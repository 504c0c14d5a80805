"""probs_from_logits against a plain per-row reference; sample_from_probs as an exact sampler."""

from __future__ import annotations

import torch

from engine.sampling import probs_from_logits, sample_from_probs
from engine.sampling.sampler import _filter

V = 32


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """One row, float64, written the obvious way: sort, keep the top k, renormalize, keep the
    smallest prefix whose cumulative mass reaches top_p (the top token always), renormalize."""
    x = logits.double() / temperature
    order = torch.argsort(x, descending=True, stable=True)
    s = x[order]
    vocab = s.numel()
    keep = torch.ones(vocab, dtype=torch.bool)
    if top_k > 0:
        keep[top_k:] = False
    probs = torch.where(keep, torch.exp(s - s[0]), torch.zeros_like(s))
    probs = probs / probs.sum()
    if top_p < 1.0:
        mass_before = torch.cumsum(probs, 0) - probs
        # the fixture must not sit on a float boundary, or float32 and float64 may disagree
        gap = (mass_before[keep] - top_p).abs().min().item()
        assert gap > 1e-5, f"ambiguous fixture: top_p={top_p} is {gap:.2e} from a cumulative mass"
        keep &= mass_before < top_p
        keep[0] = True
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    out = torch.zeros(vocab, dtype=torch.float64)
    out[order] = probs
    return out


def check_rows(logits, temperature, top_k, top_p):
    got = probs_from_logits(
        logits,
        torch.tensor(temperature, dtype=torch.float32),
        torch.tensor(top_k, dtype=torch.int64),
        torch.tensor(top_p, dtype=torch.float32),
    )
    assert got.shape == logits.shape and got.dtype == torch.float32
    assert torch.isfinite(got).all()
    for i in range(logits.shape[0]):
        ref = reference_probs(logits[i], temperature[i], top_k[i], top_p[i])
        row = got[i].double()
        # the kept set matches exactly, and filtered tokens are exactly zero
        assert torch.equal(row == 0, ref == 0), (
            f"row {i} (t={temperature[i]}, k={top_k[i]}, p={top_p[i]}): kept {int((row > 0).sum())} "
            f"tokens, reference keeps {int((ref > 0).sum())}")
        torch.testing.assert_close(row, ref, atol=1e-6, rtol=1e-4, msg=f"row {i}")
        assert abs(row.sum().item() - 1.0) < 1e-5
    return got


def _logits(n: int, seed: int, vocab: int = V, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=g) * scale


def test_temperature_only():
    temps = [0.25, 0.7, 1.0, 1.5, 3.0, 20.0]
    logits = _logits(len(temps), 0)
    got = check_rows(logits, temps, [0] * len(temps), [1.0] * len(temps))
    assert (got > 0).all()
    # a lower temperature sharpens: the top token's probability falls as temperature rises
    top = logits.argmax(-1)
    same = _logits(1, 0).expand(len(temps), V).contiguous()
    p = probs_from_logits(same, torch.tensor(temps), torch.zeros(len(temps), dtype=torch.long),
                          torch.ones(len(temps)))
    top_mass = p[:, top[0]]
    assert (top_mass[:-1] > top_mass[1:]).all()


def test_top_k_only():
    ks = [1, 2, 5, 17, V - 1, V, V + 7, 1000]
    logits = _logits(len(ks), 1)
    temps = [1.0, 0.5, 2.0, 1.0, 1.3, 1.0, 0.8, 1.0]
    got = check_rows(logits, temps, ks, [1.0] * len(ks))
    assert [int((row > 0).sum()) for row in got] == [min(k, V) for k in ks]
    # top_k=1 is the argmax, as a one-hot
    assert got[0].max().item() == 1.0 and got[0].argmax() == logits[0].argmax()


def test_top_p_only():
    ps = [0.01, 0.2, 0.45, 0.6, 0.8, 0.93, 0.999]
    logits = _logits(len(ps), 2)
    got = check_rows(logits, [1.0] * len(ps), [0] * len(ps), ps)
    # a tiny top_p keeps only the top token
    assert int((got[0] > 0).sum()) == 1 and got[0].argmax() == logits[0].argmax()
    # on one shared row the nucleus grows with top_p
    same = logits[3:4].expand(len(ps), V).contiguous()
    got = check_rows(same, [1.0] * len(ps), [0] * len(ps), ps)
    sizes = [int((row > 0).sum()) for row in got]
    assert sizes == sorted(sizes) and sizes[0] == 1 and 1 < sizes[3] < sizes[-1] < V, sizes


def test_top_p_boundary_is_the_smallest_prefix_reaching_it():
    # eight equal logits: every probability and cumulative mass is exact in float32
    logits = torch.zeros(5, 8)
    got = probs_from_logits(logits, torch.ones(5), torch.zeros(5, dtype=torch.long),
                            torch.tensor([0.125, 0.25, 0.5, 0.625, 0.99]))
    # mass 0.25 is reached by 2 tokens: the prefix stops there, it does not take a third
    assert [int((row > 0).sum()) for row in got] == [1, 2, 4, 5, 8]
    for row, n in zip(got, [1, 2, 4, 5, 8]):
        assert torch.equal(row[row > 0], torch.full((n,), 1.0 / n))
    # with top-k, the nucleus is measured on the renormalized top k: 4 tokens of 1/4 each
    got = probs_from_logits(logits[:2], torch.ones(2), torch.tensor([4, 4]), torch.tensor([0.5, 0.75]))
    assert [int((row > 0).sum()) for row in got] == [2, 3]


def test_top_k_and_top_p_together():
    # top_p is applied to the distribution renormalized over the top k
    ks = [3, 5, 8, 12, 20, 1, V + 3]
    ps = [0.5, 0.9, 0.7, 0.3, 0.85, 0.5, 0.75]
    temps = [1.0, 0.6, 1.4, 1.0, 2.0, 1.0, 0.9]
    logits = _logits(len(ks), 3)
    got = check_rows(logits, temps, ks, ps)
    for row, k in zip(got, ks):
        assert 1 <= int((row > 0).sum()) <= min(k, V)
    # on row 2, top_p cuts inside the top 8: both filters bite
    assert 1 < int((got[2] > 0).sum()) < 8


def test_per_row_parameters_in_one_batch_match_each_row_alone():
    temps = [1.0, 0.5, 2.0, 1.0, 1.0, 0.7, 1.2, 3.0, 1.0, 0.9]
    ks = [0, 0, 4, 0, 9, 2, 0, 40, V, 6]
    ps = [1.0, 1.0, 1.0, 0.62, 0.9, 1.0, 0.35, 0.95, 1.0, 0.55]
    logits = _logits(len(temps), 4)
    got = check_rows(logits, temps, ks, ps)
    for i in range(len(temps)):
        alone = probs_from_logits(logits[i:i + 1], torch.tensor([temps[i]]), torch.tensor([ks[i]]),
                                  torch.tensor([ps[i]]))
        torch.testing.assert_close(got[i:i + 1], alone, atol=1e-7, rtol=1e-6)
        assert torch.equal(got[i] == 0, alone[0] == 0)
    # a graph's path (on a GPU): every row of the batch through the sort, the unfiltered ones too
    whole = _graph_path(logits, temps, ks, ps)
    torch.testing.assert_close(whole, got, atol=1e-7, rtol=1e-5)
    assert torch.equal(whole == 0, got == 0)


def _graph_path(logits, temps, ks, ps) -> torch.Tensor:
    """``probs_from_logits``'s filtering path as a graph runs it, every row through the sort (on the CPU only the
    rows that filter take it)."""
    k, p = torch.tensor(ks), torch.tensor(ps, dtype=torch.float32)
    return _filter(logits.float() / torch.tensor(temps, dtype=torch.float32).unsqueeze(-1), k, p, k > 0, p < 1.0)


def test_unfiltered_rows_keep_their_tail_next_to_filtered_rows():
    """top_k=0, top_p=1 means off: a row's distribution must not depend on the other rows.

    Row 0 has two tokens of mass 1/2 (exact in float32) and a tail of ~1e-13 tokens: the
    cumulative mass before the tail is exactly 1.0, which must not count as reaching top_p=1."""
    vocab = 4096
    logits = _logits(4, 5, vocab=vocab, scale=3.0)
    logits[:, :64] = -40.0 - 0.25 * torch.arange(64.0)  # a long, very unlikely tail (no underflow)
    logits[0] = -30.0 - 0.01 * torch.arange(float(vocab))
    logits[0, 7] = logits[0, 9] = 0.0
    temps, ks, ps = [1.0, 1.0, 1.0, 1.0], [0, 0, 50, 0], [1.0, 1.0, 1.0, 0.9]
    got = probs_from_logits(logits, torch.tensor(temps), torch.tensor(ks), torch.tensor(ps))
    # rows 0 and 1: no filter at all -> the plain softmax, every token strictly positive
    for i in (0, 1):
        plain = torch.softmax(logits[i].double(), -1)
        assert (got[i] > 0).all(), f"row {i}: {int((got[i] == 0).sum())} tokens zeroed in an unfiltered row"
        torch.testing.assert_close(got[i].double(), plain, atol=1e-7, rtol=1e-4)
    # and through a graph's path, where rows 0 and 1 are sorted beside the filtered ones
    whole = _graph_path(logits, temps, ks, ps)
    for i in (0, 1):
        assert (whole[i] > 0).all(), f"row {i}: {int((whole[i] == 0).sum())} tokens zeroed in an unfiltered row"
        torch.testing.assert_close(whole[i].double(), torch.softmax(logits[i].double(), -1), atol=1e-7, rtol=1e-4)
    # row 2: top-k only -> exactly k tokens survive
    assert int((got[2] > 0).sum()) == 50
    for i in range(4):
        ref = reference_probs(logits[i], temps[i], ks[i], ps[i])
        assert torch.equal(got[i].double() == 0, ref == 0), f"row {i}"


def test_filtered_by_the_caller_with_no_row_filtering_is_the_softmax():
    """``filtered=True`` (a graph's key) where no row has a filter: the plain softmax, on every path."""
    logits = _logits(3, 6)
    temps, ks, ps = [1.0, 0.5, 2.0], [0, 0, 0], [1.0, 1.0, 1.0]
    got = probs_from_logits(logits, torch.tensor(temps), torch.tensor(ks), torch.tensor(ps), filtered=True)
    plain = torch.softmax(logits / torch.tensor(temps).unsqueeze(-1), -1)
    torch.testing.assert_close(got, plain, atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(_graph_path(logits, temps, ks, ps), plain, atol=1e-7, rtol=1e-5)


def test_top_k_tail_survives_when_top_p_is_off():
    # a top-k row whose k-th token is ~1e-20 relative, next to a top-p row
    logits = torch.zeros(2, 16)
    logits[:, 0] = 50.0
    logits[:, 1:16] = torch.linspace(5.0, -5.0, 15)
    got = probs_from_logits(logits, torch.ones(2), torch.tensor([4, 0]), torch.tensor([1.0, 0.5]))
    assert int((got[0] > 0).sum()) == 4
    assert int((got[1] > 0).sum()) == 1


def test_half_precision_logits():
    logits = _logits(3, 6).half()
    got = probs_from_logits(logits, torch.tensor([1.0, 0.8, 1.0]), torch.tensor([0, 5, 0]),
                            torch.tensor([1.0, 1.0, 0.7]))
    assert got.dtype == torch.float32
    for i, (t, k, p) in enumerate([(1.0, 0, 1.0), (0.8, 5, 1.0), (1.0, 0, 0.7)]):
        ref = reference_probs(logits[i].float(), t, k, p)
        torch.testing.assert_close(got[i].double(), ref, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------------- sample_from_probs


def _noise(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.empty(shape).exponential_(generator=g)


def _tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples.flatten(), minlength=probs.numel()).double()
    emp = counts / counts.sum()
    return 0.5 * (emp - probs.double() / probs.double().sum()).abs().sum().item()


def test_sample_from_probs_converges_unnormalized_with_zeros():
    weights = torch.tensor([0.0, 3.0, 0.5, 0.0, 1.2, 7.0, 0.05, 2.0, 0.0, 0.9])  # sums to 14.65
    n = 100_000
    samples = sample_from_probs(weights.expand(n, -1), _noise((n, weights.numel()), 0))
    assert samples.shape == (n,) and samples.dtype == torch.int64
    counts = torch.bincount(samples, minlength=weights.numel())
    assert counts[weights == 0].sum().item() == 0  # zero-probability entries are never drawn
    assert _tv(samples, weights) < 0.01
    # the rarest token (p ~ 0.0034) is drawn at about its rate
    assert abs(counts[6].item() / n - 0.05 / weights.sum().item()) < 0.001


def test_sample_from_probs_leading_dims_are_independent_rows():
    a = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0, 0.0, 0.0])
    b = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.25, 0.25, 0.25, 0.25])
    n = 100_000
    probs = torch.stack([a.expand(n, -1), b.expand(n, -1)])  # [2, n, 8]
    samples = sample_from_probs(probs, _noise((2, n, 8), 1))
    assert samples.shape == (2, n)
    assert samples[0].max().item() <= 3 and samples[1].min().item() >= 4
    assert _tv(samples[0], a) < 0.01 and _tv(samples[1], b) < 0.01


def test_sample_from_probs_scale_invariant():
    # normalization does not matter: scaling by a power of two (exact in float) gives the same draws
    probs = torch.softmax(_logits(1000, 7, vocab=16), -1)
    noise = _noise((1000, 16), 2)
    base = sample_from_probs(probs, noise)
    assert torch.equal(sample_from_probs(probs * 2.0 ** -60, noise), base)
    assert torch.equal(sample_from_probs(probs * 2.0 ** 40, noise), base)
    # and the draws are not all the same token
    assert base.unique().numel() > 8


def test_sample_from_probs_adversarial_noise_never_picks_zero_probability():
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7], [1e-30, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    noise = torch.tensor([[1e-30, 50.0, 1e-30, 80.0], [30.0, 1e-30, 1e-30, 1e-30],
                          [1e-38, 1e-38, 1e-38, 1e30]])
    assert sample_from_probs(probs, noise).tolist() == [3, 0, 3]  # 0.7/80 > 0.3/50
    # with unit noise it is the argmax of probs
    assert sample_from_probs(probs, torch.ones_like(probs)).tolist() == [3, 0, 3]


def test_packed_rows_round_trip_with_greedy_padding():
    """The one packing every round uses: sampled rows keep their parameters, greedy rows and padding are
    GREEDY_ROW, and unpacking gives what probs_from_logits reads."""
    from engine.config import SamplingParams
    from engine.sampling import GREEDY_ROW, RowParams, pack_rows

    params = [SamplingParams(temperature=0.7, top_k=40, top_p=0.9), SamplingParams(),
              SamplingParams(temperature=1.3)]
    packed = pack_rows(params, rows=5)
    assert packed.dtype == torch.float32 and packed.shape == (5, 4)
    for i in (1, 3, 4):
        assert tuple(packed[i].tolist()) == GREEDY_ROW
    rows = RowParams.unpack(packed)
    assert rows.greedy.tolist() == [False, True, False, True, True]
    assert rows.top_k.dtype == torch.int64 and rows.top_k.tolist() == [40, 0, 0, 0, 0]
    assert torch.equal(rows.temperature[[0, 2]], torch.tensor([0.7, 1.3]))
    assert torch.equal(rows.top_p[[0, 2]], torch.tensor([0.9, 1.0]))
    again = RowParams.of(params, torch.device("cpu")).repeat(2)
    assert again.top_k.tolist() == [40, 40, 0, 0, 0, 0] and again.greedy.tolist() == [False] * 2 + [True] * 2 + [False] * 2

"""Sampling and rejection sampling: pure functions over tensors; per-row parameters packed in one place."""

from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID, greedy_verify, rejection_sample
from engine.sampling.rows import GREEDY_ROW, RowParams, pack_rows
from engine.sampling.sampler import probs_from_logits, sample_from_probs

__all__ = ["GREEDY_ROW", "PLACEHOLDER_TOKEN_ID", "RowParams", "greedy_verify", "pack_rows", "probs_from_logits",
           "rejection_sample", "sample_from_probs"]

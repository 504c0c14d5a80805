"""Sampling and rejection sampling: pure functions over tensors."""

from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID, greedy_verify, rejection_sample
from engine.sampling.sampler import probs_from_logits, sample_from_probs

__all__ = ["PLACEHOLDER_TOKEN_ID", "greedy_verify", "rejection_sample", "probs_from_logits",
           "sample_from_probs"]

"""Triton kernels for the small steps of a speculative round, one launch each.

- ``greedy_accept``: greedy verification (accepted drafts + recovered/bonus token).
- ``rejection_accept``: lossless rejection sampling of a round (accepted drafts, then the recovered or
  bonus token by the exponential race at the one position each row draws at).
- ``kv_slots``: paged-KV slots and positions of the tokens a batch appends.
- ``next_inputs``: a fused round launched ahead chains its inputs (last committed token, next drafts, KV lengths)
  from the round before, in place.
- ``philox``: counter-based random rows (a batch's coins from its seeds and draw numbers); its
  torch reference is ``philox_ref`` (no triton: the engine's CPU path).
- ``argmax_rows``: a row's argmax (or exponential race) over the vocabulary, split across programs.
- ``rmsnorm`` and ``rotary``: a decode forward's norms and rotary embedding, one launch each
  instead of about eight and ten (``python -m bench.op_count`` shows why that matters).

Each module has a validating wrapper (ValueError naming the bad argument) and a pure-torch
``*_reference``. The kernels need CUDA tensors, or ``TRITON_INTERPRET=1`` set before they
are imported to run on the CPU. Nothing is imported here, so ``import kernels`` stays cheap.
"""

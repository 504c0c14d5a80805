"""A whole forward through the fused path (Triton norms, SiLU·mul and static attention, here under the
interpreter) equals the plain torch forward over the paged cache: what a CUDA graph replays on a GPU."""

from __future__ import annotations

import pytest
import torch

from engine.attention.base import AttentionMetadata
from engine.attention.static import StaticAttention
from engine.attention.torch_ref import TorchAttention
from engine.config import ModelConfig
from engine.kv_cache import PagedKVCache
from engine.models import ops
from engine.models.llama import LlamaForCausalLM

CFG = ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=32, max_position=512, tie_word_embeddings=True, name="tiny")


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(CFG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.5 if "embed" in name else 0.1) if p.ndim > 1 else p.normal_(1.0, 0.1)
    model.model.rotary.rebuild()
    return model.eval()


def _prefilled(model, prompts: dict[str, list[int]]) -> PagedKVCache:
    cache = PagedKVCache(CFG.num_layers, CFG.num_kv_heads, CFG.head_dim, 1024, 16, torch.float32, "cpu")
    cache.allocator.extend("__scratch__", 1)
    _run(model, cache, TorchAttention(cache, CFG.num_heads), {s: ids for s, ids in prompts.items()})
    return cache


def _meta(cache: PagedKVCache, chunks: dict[str, list[int]]) -> tuple[AttentionMetadata, torch.Tensor, torch.Tensor]:
    alloc = cache.allocator
    q_lens, kv_lens, tables, slots, ids, pos = [], [], [], [], [], []
    for s, toks in chunks.items():
        start = alloc.length(s)
        alloc.extend(s, start + len(toks))
        q_lens.append(len(toks))
        kv_lens.append(start + len(toks))
        tables.append(tuple(alloc.block_table(s)))
        slots += alloc.slots(s, start, start + len(toks))
        ids += toks
        pos += range(start, start + len(toks))
    meta = AttentionMetadata(tuple(q_lens), tuple(kv_lens), tuple(tables), torch.tensor(slots))
    return meta, torch.tensor(ids), torch.tensor(pos)


def _run(model, cache, attn, chunks, aux_layers=()):
    meta, ids, pos = _meta(cache, chunks)
    if isinstance(attn, StaticAttention):  # a bucket: inputs padded to its rows, as StepGraphs does
        attn.load(meta)
        attn.prepare()
        pad = attn.rows * attn.q_len - ids.shape[0]
        ids, pos = torch.cat([ids, torch.zeros(pad, dtype=torch.long)]), torch.cat([pos, torch.zeros(pad, dtype=torch.long)])
    else:
        attn.plan(meta)
    with torch.no_grad():
        hidden, aux = model.forward_aux(ids, pos, attn, aux_layers)
    return model.compute_logits(hidden), aux


@pytest.mark.parametrize("q_len", [1, 4])
def test_fused_static_forward_equals_the_paged_torch_forward(q_len, monkeypatch):
    model = _model()
    prompts = {"a": list(range(10, 50)), "b": list(range(60, 65)), "c": [7, 8, 9]}
    eager, fused = _prefilled(model, prompts), _prefilled(model, prompts)
    scratch = fused.allocator.block_table("__scratch__")[0]
    for step in range(2):
        chunks = {s: [(13 * step + 5 * i + len(s)) % 256 for i in range(q_len)] for s in "abc"}
        want, want_aux = _run(model, eager, TorchAttention(eager, CFG.num_heads), chunks, aux_layers=(0, 1))
        with monkeypatch.context() as m:
            m.setattr(ops, "use_kernels", lambda x: True)  # the Triton norms and SiLU·mul, interpreted
            static = StaticAttention(fused, CFG.num_heads, 4, q_len, 8, scratch, use_kernel=True)  # 1 padding row
            got, got_aux = _run(model, fused, static, chunks, aux_layers=(0, 1))
        n = 3 * q_len
        torch.testing.assert_close(got[:n], want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_aux[:n], want_aux, atol=1e-4, rtol=1e-4)
        assert torch.isfinite(got).all()  # the padding row too
        for s in "abc":  # both caches now hold the same keys and values
            blocks = torch.tensor(eager.allocator.block_table(s))
            n_tok = eager.allocator.length(s)
            assert fused.allocator.block_table(s) == eager.allocator.block_table(s)
            torch.testing.assert_close(fused.k[:, blocks].flatten(1, 2)[:, :n_tok],
                                       eager.k[:, blocks].flatten(1, 2)[:, :n_tok], atol=1e-5, rtol=1e-5)

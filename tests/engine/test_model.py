"""The real SmolLM2 through our loader and model equals transformers' LlamaForCausalLM on the same weights."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.models import ops
from engine.models.loader import load_model
from engine.runner import Chunk, ModelRunner

PROMPTS = [
    ("raw", "The three primary colors are red, yellow and"),
    ("chat", "Explain what a hash table is, in two sentences."),
    ("code", "def quicksort(items):\n    \"\"\"Sort a list.\"\"\"\n    if len(items) <= 1:\n"),
]


def our_logits(model, ids: list[int]) -> torch.Tensor:
    runner = ModelRunner(model.model, EngineConfig(kv_cache_tokens=1024))
    return runner.forward([Chunk("s", ids, num_logits=len(ids))])


@pytest.fixture(scope="module")
def prompt_ids(smollm):
    tok = smollm.tokenizer
    return [tok.encode_chat([{"role": "user", "content": t}]) if kind == "chat" else tok.encode(t)
            for kind, t in PROMPTS]


def test_config_is_smollm2_135m(smollm):
    c = smollm.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and not c.attention_bias and c.rope_theta == 100000.0


def test_logits_match_transformers(smollm, hf_smollm, prompt_ids):
    for ids in prompt_ids:
        ours = our_logits(smollm, ids)
        with torch.no_grad():
            ref = hf_smollm(torch.tensor([ids])).logits[0].float()
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max().item() <= 1e-3
        assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("rows", [1, 5, 20, 156])
def test_the_lm_head_in_vocabulary_slices_is_one_matmul(smollm, rows):
    """On the CPU the LM head runs a slice of the vocabulary at a time (ops.lm_head): each logit is the same dot
    product as in one matmul over the whole head, so the same float32 value and the same argmax."""
    weight = smollm.model.model.embed_tokens.weight
    assert weight.shape[0] > ops.CPU_VOCAB_SLICE  # sliced
    hidden = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
    sliced, whole = ops.lm_head(hidden, weight), torch.nn.functional.linear(hidden, weight)
    torch.testing.assert_close(sliced, whole, rtol=0, atol=1e-5)
    assert torch.equal(sliced.argmax(-1), whole.argmax(-1))


def test_paged_decode_matches_full_forward(smollm, prompt_ids):
    """Prefill a prefix, then decode and verify chunks through the paged cache: same logits."""
    ids = prompt_ids[1]
    full = our_logits(smollm, ids)
    runner = ModelRunner(smollm.model, EngineConfig(kv_cache_tokens=1024, kv_block_size=4))
    parts = [runner.forward([Chunk("s", ids[:10], num_logits=10)])]
    for t in ids[10:15]:
        parts.append(runner.forward([Chunk("s", [t])]))
    parts.append(runner.forward([Chunk("s", ids[15:], num_logits=len(ids) - 15)]))
    torch.testing.assert_close(torch.cat(parts), full, atol=2e-4, rtol=0)


def test_hf_directory_matches_gguf(smollm, hf_smollm, prompt_ids, tmp_path, smollm_path):
    """A sharded safetensors directory (what transformers writes) loads to the same model."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    # transformers will not save a model it loaded from GGUF; save a plain copy of the same weights
    cfg = hf_smollm.config.to_dict()
    cfg.pop("quantization_config", None)
    plain = LlamaForCausalLM(LlamaConfig(**cfg))
    plain.load_state_dict(hf_smollm.state_dict())
    plain.save_pretrained(tmp_path, max_shard_size="100MB")
    AutoTokenizer.from_pretrained(str(smollm_path.parent), gguf_file=smollm_path.name).save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_model(tmp_path, progress=False)
    assert loaded.config.num_layers == 30 and loaded.config.tie_word_embeddings
    ids = prompt_ids[0]
    torch.testing.assert_close(our_logits(loaded, ids), our_logits(smollm, ids), atol=1e-4, rtol=0)
    assert loaded.tokenizer.same_vocab(smollm.tokenizer) is None


def _paged_forward(model, ids: list[int], keep: torch.Tensor | None) -> tuple[torch.Tensor, ModelRunner]:
    """One forward of ``ids`` from position 0 through a fresh paged cache -> (final hidden, the runner)."""
    from engine.attention.base import AttentionMetadata

    runner = ModelRunner(model, EngineConfig(kv_cache_tokens=1024, kv_block_size=16, cuda_graphs=False))
    alloc, n = runner.allocator, len(ids)
    alloc.extend("s", n)
    runner.attention.plan(AttentionMetadata(q_lens=(n,), kv_lens=(n,), block_tables=(tuple(alloc.block_table("s")),),
                                            slot_mapping=torch.tensor(alloc.slots("s", 0, n), dtype=torch.long)))
    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(n), runner.attention, keep), runner


def test_kept_rows_go_on_past_the_last_attention_and_every_token_writes_its_kv(smollm, prompt_ids):
    """``keep`` (what a fused round's catch-up passes): the kept rows' outputs are the full forward's rows, and
    every token's K/V in every layer is exactly what the full forward writes."""
    ids = prompt_ids[1][:24]
    full, a = _paged_forward(smollm.model, ids, None)
    keep = torch.tensor([3, 23, 10])
    kept, b = _paged_forward(smollm.model, ids, keep)
    assert kept.shape == (3, smollm.config.hidden_size)
    torch.testing.assert_close(kept, full[keep], atol=1e-5, rtol=1e-5)  # float32 rounding of a smaller matmul
    assert torch.equal(a.cache.k, b.cache.k) and torch.equal(a.cache.v, b.cache.v)
    with pytest.raises(ValueError, match="aux_layers"):
        smollm.model.forward_aux(torch.tensor(ids), torch.arange(len(ids)), a.attention, (29,), keep)

"""Drafters: spec parsing, n-gram lookup, a standalone draft LM from a directory, tokenizer checks."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.drafters import DraftRequest, DraftSpec, build_drafter
from engine.drafters.ngram import NgramDrafter
from tests.conftest import make_decoder

GREEDY = SamplingParams(max_tokens=24, ignore_eos=True, seed=0)


@pytest.mark.parametrize("text, kind, size", [
    ("none", "none", None), ("ngram", "ngram", None), ("ngram:5", "ngram", 5), ("layerskip:4", "layerskip", 4)])
def test_parse_builtin_specs(text, kind, size):
    spec = DraftSpec.parse(text)
    assert (spec.kind, spec.size, str(spec)) == (kind, size, text)


@pytest.mark.parametrize("text", ["layerskip", "layerskip:x", "layerskip:0", "ngram:-1", "/no/such/draft"])
def test_parse_rejects_bad_specs(text):
    with pytest.raises(ValueError, match="^draft:"):
        DraftSpec.parse(text)


def test_layerskip_must_be_shallower_than_target(smollm):
    with pytest.raises(ValueError, match="fewer layers"):
        build_drafter(DraftSpec.parse("layerskip:30"), smollm, EngineConfig(kv_cache_tokens=256))


def test_ngram_lookup():
    d = NgramDrafter(max_n=3)
    assert d.lookup([5, 1, 2, 3, 4, 9, 1, 2, 3], k=2) == [4, 9]         # trigram match
    assert d.lookup([1, 2, 7, 8, 1, 2, 6, 6, 2], k=3) == [6, 6, 2]      # unigram, most recent earlier hit
    assert d.lookup([1, 2, 3, 4], k=4) == []                            # nothing repeats
    assert d.lookup([4, 4], k=4) == [4]                                 # only what exists is proposed
    [p] = d.propose([DraftRequest("r", [1, 2, 3, 1, 2], k=1, params=GREEDY)]).token_ids
    assert p == [3]


@pytest.mark.parametrize("vocab,length", [(3, 12), (5, 40), (50, 30), (2, 3)])
def test_the_lookup_on_the_device_drafts_what_the_host_lookup_drafts(vocab, length):
    """engine/drafters/ngram_graph.lookup_drafts against NgramDrafter.lookup: random histories (small vocabularies
    repeat often, large ones rarely), rows of different lengths and accepted counts, padding rows beside them."""
    import torch

    from engine.drafters.ngram_graph import lookup_drafts
    from engine.sampling.rejection import PLACEHOLDER_TOKEN_ID

    gen, k, width, host = torch.Generator().manual_seed(vocab * 1000 + length), 4, 64, NgramDrafter(max_n=3)
    for _ in range(20):
        rows = 5
        history = torch.full((rows + 2, width), 7, dtype=torch.long)  # stale tokens past what is known
        seqs, lengths, accepted, committed = [], [], [], []
        for r in range(rows):
            n = int(torch.randint(1, length + 1, (1,), generator=gen))
            seq = torch.randint(0, vocab, (n + k + 1,), generator=gen).tolist()
            a = int(torch.randint(0, k + 1, (1,), generator=gen))
            history[r, :n] = torch.tensor(seq[:n])              # L + 1 tokens: through t0
            c = seq[n:n + a + 1] + [PLACEHOLDER_TOKEN_ID] * (k - a)
            seqs.append(seq[:n + a + 1])
            lengths.append(n - 1)
            accepted.append(a)
            committed.append(c)
        slots = torch.tensor(list(range(rows)) + [rows + 1])   # a padding row on the scratch row
        got = lookup_drafts(history, slots, torch.tensor(committed + [[0] * (k + 1)]),
                            torch.tensor(accepted + [0]), torch.tensor(lengths + [0]), k, 3, 1)[:rows]
        for seq, row in zip(seqs, got.tolist()):
            want = host.lookup(seq, k)
            assert row == want + [PLACEHOLDER_TOKEN_ID] * (k - len(want)), (seq, row, want)


@pytest.fixture(scope="module")
def draft_dir(hf_smollm, smollm_path, tmp_path_factory):
    """The target's first 4 layers saved as a Hugging Face directory: a standalone draft LM."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cfg = hf_smollm.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["num_hidden_layers"] = 4
    small = LlamaForCausalLM(LlamaConfig(**cfg))
    state = {k: v for k, v in hf_smollm.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < 4}
    small.load_state_dict(state)
    path = tmp_path_factory.mktemp("draft4")
    small.save_pretrained(path)
    AutoTokenizer.from_pretrained(str(smollm_path.parent), gguf_file=smollm_path.name).save_pretrained(path)
    return path


def test_draft_model_directory_is_lossless_and_drafts_like_layerskip(smollm, draft_dir):
    prompt = smollm.tokenizer.encode_chat([{"role": "user", "content": "Write a haiku about autumn leaves."}])
    plain = make_decoder(smollm, "none").generate([prompt], GREEDY)[0]
    dec = make_decoder(smollm, str(draft_dir), k=3)
    assert dec.drafter.name == f"model:{draft_dir.name}"
    out = dec.generate([prompt], GREEDY)[0]
    assert out.new_token_ids == plain.new_token_ids
    # same weights as layerskip:4, so the same drafts for the same context
    skip = make_decoder(smollm, "layerskip:4", k=3).drafter
    req = DraftRequest("x", prompt + plain.new_token_ids[:5], k=3, params=GREEDY)
    assert dec.drafter.propose([req]).token_ids == skip.propose([req]).token_ids


def test_draft_with_another_tokenizer_is_rejected(smollm, draft_dir, tmp_path):
    bad = tmp_path / "bad-draft"
    shutil.copytree(draft_dir, bad)
    tj = json.loads((bad / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = (next(t for t, i in vocab.items() if i == n) for n in (1000, 1001))
    vocab[a], vocab[b] = 1001, 1000  # a valid tokenizer, but ids that mean other text
    (bad / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        build_drafter(DraftSpec.parse(str(bad)), smollm, EngineConfig(kv_cache_tokens=256))

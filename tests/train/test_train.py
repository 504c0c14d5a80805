"""train-draft on a tiny target: the loss falls, saved drafters load back and draft the same, the
exported draft LM loads in transformers, the corpus never reads evaluation prompts."""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig, ModelConfig, SamplingParams
from engine.drafters import DraftRequest, DraftSpec, build_drafter
from engine.models.eagle import EagleHead, load_eagle, save_eagle
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import LoadedModel, load_model
from train import corpus
from train.export import save_hf
from train.objectives import eagle_loss, lm_loss, teacher
from train.pipeline import build_eagle, build_lm, serving_copy
from train.trainer import TrainConfig, train

GREEDY = SamplingParams(max_tokens=8, seed=0)


def tiny_target(vocab: int, tokenizer, source) -> LoadedModel:
    """A random 3-layer Llama with confident (peaked) next-token distributions."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position=256, tie_word_embeddings=True, rms_norm_eps=1e-5,
                      name="tiny")
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 1.0 if "embed" in name else 0.2) if p.ndim > 1 else p.fill_(1.0)
    return LoadedModel(model.eval().requires_grad_(False), cfg, tokenizer, source, 3)


@pytest.fixture(scope="module")
def tiny(smollm) -> LoadedModel:
    """With SmolLM2's vocabulary and tokenizer, so a drafter trained on it exports as a real checkpoint."""
    return tiny_target(smollm.config.vocab_size, smollm.tokenizer, smollm.source)


def _samples(n: int = 24, length: int = 40) -> list[corpus.Sample]:
    """Sequences over 40 token ids with a repeating structure the drafter can learn."""
    rng = random.Random(0)
    out = []
    for _ in range(n):
        motif = [rng.randrange(100, 140) for _ in range(5)]  # ids < 256: fit every tiny vocabulary
        out.append(corpus.Sample((motif * 10)[:length], 6, 0.0))
    return out


def _bf16(model: torch.nn.Module) -> None:
    """Round the weights to what a saved (bfloat16) checkpoint holds, so both copies are identical."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())


CFG = TrainConfig(lr=3e-3, warmup_steps=2, max_steps=60, time_budget_s=600, batch_tokens=512, max_len=64,
                  eval_every=0)


@pytest.mark.parametrize("kind", ["eagle", "lm"])
def test_training_lowers_the_loss(kind):
    tm = tiny_target(256, None, None).model  # a small vocabulary keeps the steps fast
    torch.manual_seed(0)
    if kind == "eagle":
        model = build_eagle(tm, (0, 2))

        def step(batch):
            return eagle_loss(model, batch, teacher(tm, batch, model.eagle.aux_layers), unroll=2)
    else:
        model = build_lm(tm, 1, "slice")

        def step(batch):
            return lm_loss(model, batch, teacher(tm, batch), hard_weight=0.25)
    history = train([p for p in model.parameters() if p.requires_grad], _samples(), step, CFG,
                    torch.device("cpu"), log=lambda m: None)
    assert len(history) == CFG.max_steps
    first = sum(h["loss"] for h in history[:5]) / 5
    last = sum(h["loss"] for h in history[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert history[-1]["agree"][0] > history[0]["agree"][0]


def test_saved_eagle_head_loads_back_and_drafts_the_same(tiny, tmp_path):
    head = build_eagle(tiny.model, (0, 2))
    _bf16(head)
    save_eagle(head, tmp_path / "head")
    config = EngineConfig(kv_cache_tokens=1024, k=3)
    loaded = load_eagle(tmp_path / "head", tiny.model, "cpu", torch.float32)
    assert isinstance(loaded, EagleHead) and DraftSpec.parse(str(tmp_path / "head")).kind == "eagle"
    tokens = _samples(1)[0].tokens
    from engine.runner import Chunk, ModelRunner

    aux = ModelRunner(tiny.model, config).run([Chunk("a", tokens)], aux_layers=(0, 2)).aux
    req = [DraftRequest("r", tokens, 3, GREEDY, aux[: len(tokens) - 1], 0)]
    a = serving_copy(head, tiny, config).propose(req).token_ids
    b = build_drafter(DraftSpec.parse(str(tmp_path / "head")), tiny, config).propose(req).token_ids
    assert a == b and len(a[0]) == 3


def test_saved_draft_lm_loads_back_in_tandem_and_transformers(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    lm = build_lm(tiny.model, 2, "slice")
    _bf16(lm)
    save_hf(lm, tiny.tokenizer, tmp_path / "lm")
    config = EngineConfig(kv_cache_tokens=1024, k=3)
    tokens = _samples(1)[0].tokens
    req = [DraftRequest("r", tokens, 3, GREEDY)]
    a = serving_copy(lm, tiny, config).propose(req).token_ids
    drafter = build_drafter(DraftSpec.parse(str(tmp_path / "lm")), tiny, config)
    assert drafter.propose(req).token_ids == a
    # the same directory is a Hugging Face checkpoint (e.g. an assistant_model for assisted generation)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "lm"), dtype=torch.float32).eval()
    ours = load_model(tmp_path / "lm", progress=False).model
    ids = torch.tensor([tokens])
    with torch.no_grad():
        want = hf(ids).logits[0]
        from engine.runner import Chunk, ModelRunner

        got = ModelRunner(ours, config).run([Chunk("x", tokens, num_logits=len(tokens))]).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_corpus_never_reaches_evaluation_prompts(smollm, tmp_path):
    with pytest.raises(ValueError, match="evaluation-only"):
        corpus.chat_prompts(smollm.tokenizer, 15900, 16001, 4, 384)
    samples = _samples(3) + [corpus.Sample([1, 2, 3, 49151], 2, 0.7)]
    corpus.save(samples, tmp_path / "c.npz")
    assert corpus.load(tmp_path / "c.npz") == samples
    # a corpus directory: shards read back in name order
    corpus.save_shard(samples[2:], tmp_path / "shards", 1)
    corpus.save_shard(samples[:2], tmp_path / "shards", 0)
    assert corpus.exists(tmp_path / "shards") and not corpus.exists(tmp_path / "none")
    assert corpus.load(tmp_path / "shards") == samples
    assert len(corpus.reshard(samples, tmp_path / "big", max_tokens=79)) == 3  # 40 | 40 | 40 + 4 tokens
    assert corpus.load(tmp_path / "big") == samples


def test_all_turns_prompts_carry_the_conversation_before_them(smollm):
    tok = smollm.tokenizer
    first = corpus.chat_prompts(tok, 0, 30, 1000, 4096)
    every = corpus.chat_prompts(tok, 0, 30, 1000, 4096, turns="all")
    assert len(every) > len(first) and all(p in every for p in first)
    later = [p for p in every if p not in first]
    # a later turn's prompt holds an earlier assistant turn and ends with the generation prompt, as served
    assistant = tok.encode("<|im_start|>assistant", add_special_tokens=False)
    for p in later:
        heads = [i for i in range(len(p) - len(assistant) + 1) if p[i: i + len(assistant)] == assistant]
        assert len(heads) >= 2 and heads[-1] == len(p) - len(assistant) - 1
    assert len(corpus.chat_prompts(tok, 0, 30, 3, 4096, turns="all")) == 3


def test_time_boxed_corpus_writes_each_block_as_it_ends(smollm, tmp_path):
    """Block 0 always runs; past the budget no new block starts; every prompt gets one answer per temperature."""
    samples = corpus.build(smollm.model, smollm.tokenizer, 8, 96, 3, batch_size=1, seed=0, temperatures=(0.0, 0.7),
                           time_budget_s=1e-6, shards=tmp_path / "c", log=lambda m: None)
    assert len(samples) == 4  # 2 prompts (one block of 2 batches of 1) x 2 temperatures
    assert sorted(s.temperature for s in samples) == [0.0] * 2 + [0.7] * 2
    assert corpus.load(tmp_path / "c") == samples
    greedy = [s for s in samples if s.temperature == 0.0]
    sampled = [s for s in samples if s.temperature == 0.7]
    assert [s.tokens[: s.prompt_len] for s in greedy] == [s.tokens[: s.prompt_len] for s in sampled]


def test_corpus_answers_are_the_targets_greedy_output(smollm):
    """Left-padded batched generation (prompts of different lengths) answers exactly as the engine does."""
    from tests.conftest import make_decoder

    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}])
               for t in ("Hi", "Explain why the sky is blue in two sentences.", "Name a prime number.")]
    got = corpus.generate(smollm.model, prompts, frozenset(), 12, 0.0, batch_size=3, seed=0)
    want = make_decoder(smollm, "none").generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))
    assert got == [o.new_token_ids for o in want]


def test_engine_generator_answers_like_the_dense_one(smollm):
    """Greedy answers through the serving engine equal the dense generator's, EOS included where reached."""
    prompts = [smollm.tokenizer.encode_chat([{"role": "user", "content": t}])
               for t in ("Say hi.", "Name a prime number.", "Count from one to five.")]
    eos = smollm.tokenizer.eos_token_ids
    want = corpus.generate(smollm.model, prompts, eos, 24, 0.0, batch_size=3, seed=0)
    got = corpus.generate_engine(smollm.model, smollm.tokenizer, prompts, 24, 0.0, batch_size=2, seed=0)
    assert got == want
    assert any(a and a[-1] in eos for a in want)  # at least one answer reached EOS inside the cap


def test_replies_are_templated_prompts_and_written_replies_before_the_held_out_range(smollm):
    from bench.datasets import sharegpt

    tok = smollm.tokenizer
    got = corpus.replies(tok, 5, max_prompt_tokens=384, max_tokens=96)
    assert len(got) == 5
    convs = {c.index: c for c in sharegpt(split="train", limit=40)}
    for s in got:
        assert s.temperature == corpus.ORIGINAL_REPLY and 0 < s.prompt_len < len(s.tokens) <= 96
        # the prompt part is exactly what serving sends for a user message
        text = tok.decode(s.tokens[: s.prompt_len])
        assert s.tokens[: s.prompt_len] == tok.encode_chat([{"role": "user", "content": _user_of(text, convs)}])
    short = corpus.replies(tok, 40, max_prompt_tokens=384, max_tokens=100_000)
    assert any(s.tokens[-1] in tok.eos_token_ids for s in short)  # whole replies end with EOS


def _user_of(prompt_text: str, convs) -> str:
    """The ShareGPT user turn whose text the templated prompt holds."""
    for c in convs.values():
        for role, text in c.turns:
            if role == "user" and text.strip() and text in prompt_text:
                return text
    raise AssertionError("templated prompt holds no ShareGPT user turn")

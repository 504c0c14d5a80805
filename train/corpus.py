"""The distillation corpus: ShareGPT prompts answered by the target itself.

Prompts are the first user turn of ShareGPT conversations with index < ``VAL_START`` (training)
or in ``[VAL_START, SHAREGPT_EVAL_START)`` (held out for the acceptance checks during training);
conversations >= 16000 are evaluation-only and never read here. The target answers every
prompt in large padded batches, greedily for some and sampled (temperature 0.7) for the rest,
so the drafter learns the target's behaviour on the text it will actually draft.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from bench.datasets import SHAREGPT_EVAL_START, sharegpt
from engine.models.llama import LlamaForCausalLM
from engine.tokenizer import Tokenizer
from train.dense import CachedAttention

VAL_START = 15800  # [15800, 16000): held out from training, used for the periodic acceptance check


@dataclass(frozen=True)
class Sample:
    tokens: list[int]   # prompt + the target's response
    prompt_len: int
    temperature: float  # how the response was generated (0 = greedy)


def chat_prompts(tokenizer: Tokenizer, start: int, stop: int, limit: int, max_prompt_tokens: int) -> list[list[int]]:
    """First user turns of ShareGPT conversations start <= index < stop, chat-templated."""
    if stop > SHAREGPT_EVAL_START:
        raise ValueError(f"corpus: ShareGPT index {stop} reaches the evaluation-only range (>= {SHAREGPT_EVAL_START})")
    out = []
    for conv in sharegpt(split="train"):
        if conv.index < start:
            continue
        if conv.index >= stop or len(out) >= limit:
            break
        text = conv.first_user_text
        if not text:
            continue
        ids = tokenizer.encode_chat([{"role": "user", "content": text}])
        if len(ids) <= max_prompt_tokens:
            out.append(ids)
    return out


@torch.inference_mode()
def generate(model: LlamaForCausalLM, prompts: Sequence[Sequence[int]], eos_ids: frozenset[int], max_new: int,
             temperature: float, batch_size: int, seed: int, desc: str = "generate") -> list[list[int]]:
    """The target's responses to ``prompts`` (EOS included when reached), in prompt order."""
    cfg = model.config
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    gen = torch.Generator(device=dev).manual_seed(seed)
    eos = torch.tensor(sorted(eos_ids), device=dev)
    for b0 in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", leave=False):
        idx = order[b0: b0 + batch_size]
        b = len(idx)
        plen = max(len(prompts[i]) for i in idx)
        pad = torch.tensor([plen - len(prompts[i]) for i in idx], device=dev)
        ids = torch.zeros(b, plen, dtype=torch.long, device=dev)
        for row, i in enumerate(idx):
            ids[row, plen - len(prompts[i]):] = torch.tensor(prompts[i], device=dev)
        attn = CachedAttention(cfg.num_layers, b, plen + max_new, cfg.num_kv_heads, cfg.head_dim, pad, dtype, dev)
        pos = (torch.arange(plen, device=dev)[None, :] - pad[:, None]).clamp(min=0)
        tokens = ids
        responses = torch.zeros(b, max_new, dtype=torch.long, device=dev)
        done = torch.zeros(b, dtype=torch.bool, device=dev)
        length = torch.full((b,), max_new, device=dev)
        for t in range(max_new):
            attn.step(tokens.shape[1])
            hidden = model(tokens.reshape(-1), pos.reshape(-1), attn).view(b, tokens.shape[1], -1)[:, -1]
            logits = model.compute_logits(hidden)
            if temperature == 0:
                nxt = logits.argmax(-1)
            else:
                nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=gen).squeeze(-1)
            responses[:, t] = nxt
            hit = torch.isin(nxt, eos) & ~done
            length = torch.where(hit, t + 1, length)
            done |= hit
            if t % 16 == 15 and bool(done.all()):
                break
            tokens = nxt[:, None]
            pos = pos[:, -1:] + 1
        for row, (i, n) in enumerate(zip(idx, length.tolist())):
            out[i] = responses[row, :n].tolist()
    return out


def build(model: LlamaForCausalLM, tokenizer: Tokenizer, num_prompts: int, max_prompt_tokens: int, max_new: int,
          batch_size: int, seed: int, sampled_fraction: float = 0.5) -> list[Sample]:
    """Answer ``num_prompts`` training prompts with the target: a share greedy, the rest at T=0.7."""
    prompts = chat_prompts(tokenizer, 0, VAL_START, num_prompts, max_prompt_tokens)
    random.Random(seed).shuffle(prompts)
    n_sampled = int(len(prompts) * sampled_fraction)
    samples = []
    for temp, part in ((0.0, prompts[n_sampled:]), (0.7, prompts[:n_sampled])):
        if not part:
            continue
        responses = generate(model, part, tokenizer.eos_token_ids, max_new, temp, batch_size, seed,
                             desc=f"target answers (T={temp})")
        samples += [Sample(list(p) + r, len(p), temp) for p, r in zip(part, responses) if r]
    return samples


def save(samples: list[Sample], path: Path) -> None:
    """Compact: one flat token array (uint16 when the vocabulary fits) + offsets, prompt lengths, temperatures."""
    import numpy as np

    flat = [t for s in samples for t in s.tokens]
    dtype = np.uint16 if max(flat, default=0) < 1 << 16 else np.int32
    np.savez_compressed(path, tokens=np.asarray(flat, dtype=dtype),
                        lengths=np.asarray([len(s.tokens) for s in samples], dtype=np.int32),
                        prompt_lens=np.asarray([s.prompt_len for s in samples], dtype=np.int32),
                        temperatures=np.asarray([s.temperature for s in samples], dtype=np.float64))


def load(path: Path) -> list[Sample]:
    import numpy as np

    with np.load(path) as f:
        tokens, lengths = f["tokens"].astype(np.int64), f["lengths"]
        prompt_lens, temps = f["prompt_lens"], f["temperatures"]
    ends = np.cumsum(lengths)
    return [Sample(tokens[e - n: e].tolist(), int(p), float(t))
            for e, n, p, t in zip(ends, lengths, prompt_lens, temps)]

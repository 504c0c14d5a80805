"""The training loop shared by both drafter kinds: batches by token budget, AdamW with warmup and
cosine decay, a time budget, a progress bar, and a periodic acceptance check that runs the real
speculative decoder on held-out prompts (the number that matters, not a proxy)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from tqdm import tqdm

from train.corpus import Sample
from train.objectives import Batch, StepStats


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 3e-4
    weight_decay: float = 0.0
    warmup_steps: int = 50
    max_steps: int = 100_000
    time_budget_s: float = 300.0
    batch_tokens: int = 16384
    max_len: int = 1024
    eval_every: int = 200
    seed: int = 0


def batches(samples: Sequence[Sample], cfg: TrainConfig, device: torch.device, rng: random.Random):
    """Endless shuffled batches of similar-length samples, about ``batch_tokens`` tokens each."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens))
    groups, cur, cur_max = [], [], 0
    for i in order:
        n = min(len(samples[i].tokens), cfg.max_len)
        if cur and max(cur_max, n) * (len(cur) + 1) > cfg.batch_tokens:
            groups.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, n)
    if cur:
        groups.append(cur)
    while True:
        rng.shuffle(groups)
        for g in groups:
            s = max(min(len(samples[i].tokens), cfg.max_len) for i in g)
            tokens = torch.zeros(len(g), s, dtype=torch.long)
            mask = torch.zeros(len(g), s, dtype=torch.bool)
            for row, i in enumerate(g):
                t = samples[i].tokens[: cfg.max_len]
                tokens[row, : len(t)] = torch.tensor(t)
                mask[row, max(samples[i].prompt_len - 1, 0): len(t) - 1] = True  # next token is a response token
            yield Batch(tokens.to(device), mask.to(device))


def lr_at(step: int, frac: float, cfg: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to 10 % as ``frac`` (run progress) goes 0 -> 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train(params: list[torch.nn.Parameter], samples: Sequence[Sample], step_fn: Callable[[Batch], tuple],
          cfg: TrainConfig, device: torch.device, evaluate: Callable[[], float] | None = None,
          log: Callable[[str], None] = print) -> list[dict]:
    """Run until max_steps or the time budget; returns the history (loss, agreement, evals)."""
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    history: list[dict] = []
    stream = batches(samples, cfg, device, random.Random(cfg.seed))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)
    bar = tqdm(total=round(cfg.time_budget_s), desc="train", unit="s")  # advances with training time
    start = time.monotonic()
    eval_s = 0.0  # held-out checks do not eat the training budget's schedule
    step = 0
    while True:
        train_s = time.monotonic() - start - eval_s
        # progress through the run: by steps or by the time budget, whichever ends it first
        frac = max(step / cfg.max_steps, train_s / cfg.time_budget_s)
        if frac >= 1.0:
            break
        lr = lr_at(step, frac, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = next(stream)
        with autocast:
            loss, stats = step_fn(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        stats: StepStats
        row = {"step": step, "loss": round(stats.loss, 4), "agree": [round(a, 3) for a in stats.agree],
               "lr": lr, "elapsed_s": round(time.monotonic() - start, 1)}
        bar.set_postfix(step=step, loss=f"{stats.loss:.3f}", agree="/".join(f"{a:.2f}" for a in stats.agree), refresh=False)
        bar.update(min(bar.total, int(time.monotonic() - start - eval_s)) - bar.n)
        if evaluate is not None and cfg.eval_every and step % cfg.eval_every == 0:
            t0 = time.monotonic()
            row["held_out_acceptance"] = round(evaluate(), 3)
            eval_s += time.monotonic() - t0
            log(f"step {step}: loss {stats.loss:.3f}, held-out acceptance length {row['held_out_acceptance']:.2f}")
        history.append(row)
    bar.close()
    return history

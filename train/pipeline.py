"""``tandem train-draft``: corpus -> drafter -> periodic held-out acceptance -> saved checkpoint.

Two kinds share the corpus, the loop and the acceptance check:
- ``lm``: a small Llama initialised from a slice of the target (its first N layers, its
  embeddings and final norm copied) or from scratch, distilled on the target's distributions;
  saved in Hugging Face Llama format.
- ``eagle``: an EAGLE head (engine/models/eagle.py) on the target's low/middle/high features,
  trained with a 3-step unroll; saved as safetensors + config.json (bf16, a few MB).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import torch

from engine.config import EngineConfig, SamplingParams
from engine.factory import decoder_for
from engine.drafters.eagle import EagleDrafter
from engine.drafters.model_drafter import ModelDrafter
from engine.models.eagle import EagleConfig, EagleHead, default_aux_layers, load_eagle, save_eagle
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import LoadedModel
from train import corpus
from train.export import save_hf
from train.objectives import eagle_loss, lm_loss, teacher
from train.trainer import TrainConfig, train


@dataclass(frozen=True)
class DraftTrainSpec:
    kind: Literal["eagle", "lm"]
    out: Path
    layers: int = 4                  # lm: decoder layers of the draft
    init: Literal["slice", "scratch"] = "slice"
    unroll: int = 3                  # eagle: training-time unroll steps
    aux_layers: tuple[int, ...] | None = None  # eagle: None = low/middle/high of the target
    hard_weight: float = 0.25        # weight of the argmax cross-entropy next to the soft one
    resume: Path | None = None       # eagle: continue from a head saved earlier instead of a fresh one


def build_lm(target: LlamaForCausalLM, layers: int, init: str) -> LlamaForCausalLM:
    cfg = target.config.truncated(layers)
    dev = next(target.parameters()).device
    draft = LlamaForCausalLM(cfg).to(dev, torch.float32)
    draft.model.rotary.rebuild()
    if init == "slice":
        own = draft.state_dict()
        for name, t in target.state_dict().items():
            if name in own and not name.startswith("model.rotary."):
                own[name].copy_(t.float())
    return draft.train().requires_grad_(True)


def build_eagle(target: LlamaForCausalLM, aux_layers: tuple[int, ...] | None, resume: Path | None = None
                ) -> EagleHead:
    dev = next(target.parameters()).device
    if resume is not None:  # float32 master weights again, trainable
        return load_eagle(resume, target, dev, torch.float32).train().requires_grad_(True)
    cfg = EagleConfig(target=target.config, aux_layers=aux_layers or default_aux_layers(target.config.num_layers))
    head = EagleHead(cfg).to(dev, torch.float32)
    with torch.no_grad():  # start the decoder layer from the target's last layer (same shapes)
        head.layer.load_state_dict(target.model.layers[-1].state_dict())
        head.norm.weight.copy_(target.model.norm.weight.float())
    return head.attach(target).train().requires_grad_(True)


def serving_copy(drafter_model: torch.nn.Module, target: LoadedModel, config: EngineConfig):
    """A frozen copy in the serving dtype, wrapped as the drafter the engine would run."""
    dtype = config.torch_dtype
    if isinstance(drafter_model, EagleHead):
        head = EagleHead(drafter_model.eagle).to(config.device, dtype)
        head.load_state_dict(drafter_model.state_dict())
        return EagleDrafter("eagle:training", head.attach(target.model).eval().requires_grad_(False), config)
    lm = LlamaForCausalLM(drafter_model.config).to(config.device, dtype)
    lm.load_state_dict(drafter_model.state_dict())
    lm.model.rotary.rebuild()
    return ModelDrafter("lm:training", lm.eval().requires_grad_(False), config, target.config.vocab_size)


def acceptance(target: LoadedModel, drafter, prompts: Sequence[Sequence[int]], config: EngineConfig,
               params: SamplingParams) -> float:
    """Mean committed tokens per round (accepted + 1) of the real speculative decoder."""
    dec = decoder_for(target, config, drafter)
    outs = dec.generate(prompts, params)
    committed = sum(o.num_output_tokens for o in outs)
    rounds = sum(o.rounds for o in outs)
    return committed / max(rounds, 1)


def run(target: LoadedModel, spec: DraftTrainSpec, samples: Sequence[corpus.Sample], cfg: TrainConfig,
        val_prompts: Sequence[Sequence[int]], engine: EngineConfig, log=print) -> dict:
    """Train one drafter, check held-out acceptance as it goes, save it; returns the report."""
    device = torch.device(engine.device)
    tm = target.model
    if spec.kind == "eagle":
        model = build_eagle(tm, spec.aux_layers, spec.resume)
        aux = model.eagle.aux_layers

        def step_fn(batch):
            return eagle_loss(model, batch, teacher(tm, batch, aux), unroll=spec.unroll,
                              hard_weight=spec.hard_weight)
    else:
        model = build_lm(tm, spec.layers, spec.init)

        def step_fn(batch):
            return lm_loss(model, batch, teacher(tm, batch), hard_weight=spec.hard_weight)
    params = [p for p in model.parameters() if p.requires_grad]
    k = engine.k
    greedy = SamplingParams(max_tokens=64)

    def evaluate() -> float:
        model.eval()
        try:
            return acceptance(target, serving_copy(model, target, engine), val_prompts, engine, greedy)
        finally:
            model.train()

    log(f"train-draft: {spec.kind}, {sum(p.numel() for p in params) / 1e6:.1f}M trainable parameters, "
        f"{len(samples)} sequences, {sum(len(s.tokens) for s in samples)} tokens")
    before = evaluate() if val_prompts else None
    start = time.monotonic()
    history = train(params, samples, step_fn, cfg, device, evaluate if val_prompts else None, log)
    train_s = time.monotonic() - start
    after = evaluate() if val_prompts else None
    report = {"kind": spec.kind, "steps": len(history), "train_s": round(train_s, 1),
              "final_loss": history[-1]["loss"] if history else None,
              "held_out_acceptance_before": before, "held_out_acceptance": after, "k": k,
              "sequences": len(samples), "tokens": sum(len(s.tokens) for s in samples),
              "replies": sum(s.temperature == corpus.ORIGINAL_REPLY for s in samples),
              "train_config": dataclasses.asdict(cfg), "history": history[-50:]}
    meta = {"tandem_train": {k_: v for k_, v in report.items() if k_ != "history"}}
    if spec.kind == "eagle":
        save_eagle(model, spec.out, extra=meta)
    else:
        meta["tandem_train"].update(layers=spec.layers, init=spec.init)
        save_hf(model, target.tokenizer, spec.out, extra=meta)
    (spec.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report

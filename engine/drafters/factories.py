"""Constructors behind the drafter registry (imported only when that kind is asked for)."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.drafters import DraftSpec
from engine.models.loader import LoadedModel


def ngram(spec: DraftSpec, target: LoadedModel, config: EngineConfig):
    from engine.drafters.ngram import NgramDrafter
    from engine.drafters.ngram_graph import TokenHistory

    history = None
    if config.use_fused_rounds:  # a row per request the engine may run, a whole context each
        context = min(config.max_context or target.config.max_position, target.config.max_position)
        width = -(-context // config.kv_block_size) * config.kv_block_size
        history = TokenHistory(config.max_batch_size, width, config.device)
    return NgramDrafter(max_n=spec.size or 3, history=history)


def layer_skip(spec: DraftSpec, target: LoadedModel, config: EngineConfig):
    from engine.drafters.model_drafter import ModelDrafter

    if not 1 <= spec.size < target.total_layers:
        raise ValueError(f"draft: layerskip:{spec.size} must use fewer layers than the target's "
                         f"{target.total_layers}")
    return ModelDrafter.layer_skip(target.model, spec.size, config)


def draft_model(spec: DraftSpec, target: LoadedModel, config: EngineConfig):
    from engine.drafters.model_drafter import ModelDrafter
    from engine.models.loader import load_model

    draft = load_model(spec.path, device=config.device, dtype=config.torch_dtype)
    mismatch = draft.tokenizer.same_vocab(target.tokenizer)
    if mismatch is not None:
        raise ValueError(f"draft: {spec.path} does not share the target's tokenizer ({mismatch}); "
                         "a draft model must use exactly the target's vocabulary")
    return ModelDrafter(f"model:{spec.path.name}", draft.model, config, target.config.vocab_size)


def eagle_head(spec: DraftSpec, target: LoadedModel, config: EngineConfig):
    from engine.drafters.eagle import EagleDrafter
    from engine.models.eagle import load_eagle

    head = load_eagle(spec.path, target.model, device=config.device, dtype=config.torch_dtype,
                      target_layers=target.total_layers)
    return EagleDrafter(f"eagle:{spec.path.name}", head, config)

"""Drafter registry: ``--draft`` text -> a typed ``DraftSpec`` -> a drafter, imported lazily.

Forms: ``auto`` (the default: the trained drafter that ships for this target under
``engine/drafters/trained/``, else ``ngram``), ``none`` (plain decoding), ``ngram`` or
``ngram:N`` (prompt lookup, n-grams up to N),
``layerskip:N`` (the target's first N layers as a self-draft), or a path: a directory written
by ``tandem train-draft --kind eagle`` (an EAGLE head) or a Llama-family checkpoint (GGUF file
or Hugging Face directory) sharing the target's tokenizer.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from engine.drafters.base import Drafter, DraftProposal, DraftRequest

if TYPE_CHECKING:
    from engine.config import EngineConfig, ModelConfig
    from engine.models.loader import LoadedModel

__all__ = ["DraftProposal", "DraftRequest", "Drafter", "DraftSpec", "build_drafter", "resolve_draft"]

DEFAULT_DRAFT = "auto"
TRAINED_DIR = Path(__file__).resolve().parent / "trained"  # drafters trained by `tandem train-draft`, shipped


@dataclass(frozen=True)
class DraftSpec:
    kind: Literal["auto", "none", "ngram", "layerskip", "model", "eagle"]
    size: int | None = None   # ngram: max n; layerskip: number of layers
    path: Path | None = None  # model: the draft checkpoint

    @classmethod
    def parse(cls, text: str) -> "DraftSpec":
        name, _, arg = text.strip().partition(":")
        if name in ("none", "auto") and not arg:
            return cls(name)
        if name in ("ngram", "layerskip"):
            if name == "layerskip" and not arg:
                raise ValueError("draft: layerskip needs a layer count, e.g. layerskip:4")
            try:
                size = int(arg) if arg else None
            except ValueError:
                raise ValueError(f"draft: {name} takes an integer, got {arg!r}") from None
            if size is not None and size < 1:
                raise ValueError(f"draft: {name}:{size} must be >= 1")
            return cls(name, size=size)
        path = Path(text).expanduser()
        if not path.exists():
            raise ValueError(f"draft: {text!r} is not auto, ngram[:N], layerskip:N, none, "
                             "or an existing GGUF file / Hugging Face directory")
        from engine.models.eagle import is_eagle_dir

        return cls("eagle" if is_eagle_dir(path) else "model", path=path)

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        return self.kind if self.size is None else f"{self.kind}:{self.size}"


# kind -> "module:factory"; factories take (spec, target, engine_config)
_REGISTRY = {
    "ngram": "engine.drafters.factories:ngram",
    "layerskip": "engine.drafters.factories:layer_skip",
    "model": "engine.drafters.factories:draft_model",
    "eagle": "engine.drafters.factories:eagle_head",
}


def trained_drafter_for(target: "ModelConfig") -> Path | None:
    """The shipped drafter trained for this target architecture (every field but the name equal), if any."""
    import dataclasses

    from engine.models.eagle import EagleConfig, is_eagle_dir

    if not TRAINED_DIR.is_dir():
        return None
    want = dataclasses.replace(target, name="")
    for d in sorted(TRAINED_DIR.iterdir()):
        cfg = d / "config.json"
        if is_eagle_dir(d) and dataclasses.replace(EagleConfig.from_json(json.loads(cfg.read_text())).target,
                                                  name="") == want:
            return d
    return None


def resolve_draft(spec: DraftSpec, target: "ModelConfig", quiet: bool = False) -> DraftSpec:
    """``auto`` -> the shipped trained drafter for this target, else ``ngram`` (said on stderr); others as given."""
    if spec.kind != "auto":
        return spec
    path = trained_drafter_for(target)
    chosen = DraftSpec("ngram") if path is None else DraftSpec("eagle", path=path)
    if not quiet:
        why = f"the trained drafter for this model, {path.name}" if path else \
            "no trained drafter ships for this model, so prompt lookup (ngram)"
        print(f"tandem: --draft auto: {why}", file=sys.stderr)
    return chosen


def build_drafter(spec: DraftSpec, target: "LoadedModel", config: "EngineConfig") -> Drafter | None:
    spec = resolve_draft(spec, target.config, quiet=True)
    if spec.kind == "none":
        return None
    module, _, factory = _REGISTRY[spec.kind].partition(":")
    return getattr(importlib.import_module(module), factory)(spec, target, config)

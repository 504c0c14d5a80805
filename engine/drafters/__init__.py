"""Drafter registry: ``--draft`` text -> a typed ``DraftSpec`` -> a drafter, imported lazily.

Forms: ``none`` (plain decoding), ``ngram`` or ``ngram:N`` (prompt lookup, n-grams up to N),
``layerskip:N`` (the target's first N layers as a self-draft), or a path: a directory written
by ``tandem train-draft --kind eagle`` (an EAGLE head) or a Llama-family checkpoint (GGUF file
or Hugging Face directory) sharing the target's tokenizer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from engine.drafters.base import Drafter, DraftProposal, DraftRequest

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.models.loader import LoadedModel

__all__ = ["DraftProposal", "DraftRequest", "Drafter", "DraftSpec", "build_drafter"]

DEFAULT_DRAFT = "ngram"


@dataclass(frozen=True)
class DraftSpec:
    kind: Literal["none", "ngram", "layerskip", "model", "eagle"]
    size: int | None = None   # ngram: max n; layerskip: number of layers
    path: Path | None = None  # model: the draft checkpoint

    @classmethod
    def parse(cls, text: str) -> "DraftSpec":
        name, _, arg = text.strip().partition(":")
        if name == "none" and not arg:
            return cls("none")
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
            raise ValueError(f"draft: {text!r} is not ngram[:N], layerskip:N, none, "
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


def build_drafter(spec: DraftSpec, target: "LoadedModel", config: "EngineConfig") -> Drafter | None:
    if spec.kind == "none":
        return None
    module, _, factory = _REGISTRY[spec.kind].partition(":")
    return getattr(importlib.import_module(module), factory)(spec, target, config)

"""A drafter in words, for people (``tandem demo``): what it is, what it was trained for, how big it is.

Reads only configuration and file headers: nothing is loaded onto a device.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from engine.drafters import DraftSpec, resolve_draft

if TYPE_CHECKING:
    from engine.models.loader import LoadedModel

# a GGUF file's quantization suffix: SmolLM2-135M-Instruct.Q4_1.gguf -> SmolLM2-135M-Instruct
_QUANT = re.compile(r"[.-](?:I?Q\d\w*|F16|F32|BF16)$", re.IGNORECASE)


def model_name(source: Path | str) -> str:
    """A model's name as its file or directory spells it (a synthetic: spec as it is)."""
    if not isinstance(source, Path):
        return str(source)
    return _QUANT.sub("", source.stem if source.suffix == ".gguf" else source.name)


def parameter_count(path: Path) -> int:
    """Parameters in the safetensors files of a directory, from their headers alone."""
    from safetensors import safe_open

    total = 0
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, "np") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


def describe_draft(draft: str, target: "LoadedModel") -> str:
    """``--draft`` text -> a sentence, e.g. "an EAGLE head trained for SmolLM2-135M-Instruct, 5.2M parameters"."""
    spec = resolve_draft(DraftSpec.parse(draft), target.config, quiet=True)
    name = model_name(target.source)
    if spec.kind == "none":
        return "none: plain decoding, one target forward per token"
    if spec.kind == "ngram":
        return f"prompt lookup (n-grams of up to {spec.size or 3} tokens from the text so far; no model)"
    if spec.kind == "layerskip":
        return f"{name}'s own first {spec.size} of {target.total_layers} layers (a self-draft, no training)"
    if spec.kind == "eagle":
        cfg = json.loads((spec.path / "config.json").read_text())
        params = parameter_count(spec.path)
        # ``auto`` picks only a shipped head whose recorded target has exactly this target's shapes
        what = f"trained for {name}" if draft.strip() == "auto" else f"from {spec.path}"
        return (f"an EAGLE head {what}, {params / 1e6:.1f}M parameters (one decoder layer fed "
                f"the target's layers {', '.join(map(str, cfg['aux_layers']))}; it drafts through the target's own "
                f"embedding and LM head)")
    return f"a draft model, {model_name(spec.path)} ({spec.path})"

"""An EAGLE-style draft head: one decoder layer that drafts from the target's own features.

Vocabulary. The target's *aux features* at position t are its residual stream after a few
layers (low, middle, high, as in EAGLE-3), concatenated: ``[len(aux_layers) * hidden]``.
``fuse`` maps them to one ``hidden`` vector, the head's *feature* f_t. Head entry p (for token
positions p >= 1) reads token x_p and the feature f_{p-1} of the position before it and
returns an output g_p whose logits (head norm + the target's LM head) predict x_{p+1}.
Drafting past the last verified position feeds the head its own output: entry p + 1 reads
(draft token, g_p). Entry p sits at rotary position p - 1.

The head owns only its own weights; the token embedding and LM head are the target's,
borrowed, never saved with the head.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from engine.attention.base import AttentionBackend
from engine.config import ModelConfig, RopeScaling
from engine.models import ops
from engine.models.layers import RMSNorm
from engine.models.llama import DecoderLayer, LlamaForCausalLM
from engine.models.meta import build_empty

EAGLE_KIND = "tandem-eagle"  # config.json "tandem_drafter" value


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high layers of the target (0-based layer indices)."""
    return tuple(sorted({min(1, num_layers - 1), max(0, num_layers // 2 - 1), max(0, num_layers - 4)}))


@dataclass(frozen=True)
class EagleConfig:
    target: ModelConfig            # the target's config; the head's layer has the target's shapes
    aux_layers: tuple[int, ...]    # sorted target layer indices whose outputs are the aux features

    def __post_init__(self) -> None:
        if not self.aux_layers or list(self.aux_layers) != sorted(set(self.aux_layers)):
            raise ValueError(f"aux_layers: must be sorted, distinct and non-empty, got {self.aux_layers}")
        if not all(0 <= i < self.target.num_layers for i in self.aux_layers):
            raise ValueError(f"aux_layers: {self.aux_layers} outside the target's {self.target.num_layers} layers")

    @property
    def aux_size(self) -> int:
        return len(self.aux_layers) * self.target.hidden_size

    @property
    def layer_config(self) -> ModelConfig:
        return self.target.truncated(1)

    def to_json(self) -> dict:
        return {"tandem_drafter": EAGLE_KIND, "aux_layers": list(self.aux_layers), "target": asdict(self.target)}

    @classmethod
    def from_json(cls, data: dict) -> "EagleConfig":
        if data.get("tandem_drafter") != EAGLE_KIND:
            raise ValueError(f"config.json: tandem_drafter is {data.get('tandem_drafter')!r}, not {EAGLE_KIND!r}")
        t = dict(data["target"])
        t["rope_scaling"] = RopeScaling(**t["rope_scaling"])
        return cls(target=ModelConfig(**t), aux_layers=tuple(data["aux_layers"]))


def is_eagle_dir(path: Path) -> bool:
    cfg = path / "config.json"
    if not (path.is_dir() and cfg.is_file()):
        return False
    try:
        return json.loads(cfg.read_text()).get("tandem_drafter") == EAGLE_KIND
    except (OSError, ValueError):
        return False


class EagleHead(nn.Module):
    def __init__(self, cfg: EagleConfig) -> None:
        super().__init__()
        h = cfg.target.hidden_size
        self.config = cfg.layer_config  # what a ModelRunner sizes its KV cache from: one layer
        self.eagle = cfg
        self.fuse = nn.Linear(cfg.aux_size, h, bias=False)
        self.eps = cfg.target.rms_norm_eps
        self.embed_norm = RMSNorm(h, self.eps)
        self.feature_norm = RMSNorm(h, self.eps)
        self.proj = nn.Linear(2 * h, h, bias=False)
        self.layer = DecoderLayer(self.config, 0)
        self.norm = RMSNorm(h, self.eps)
        self._target: tuple[LlamaForCausalLM, ...] = ()  # borrowed, kept out of state_dict

    def attach(self, target: LlamaForCausalLM, target_layers: int | None = None) -> "EagleHead":
        """Borrow the target's embedding and LM head (checked against the head's config).

        ``target_layers``: the full target's depth when ``target`` holds only some of its layers
        (a drafter service needs the embedding and head, not the layers)."""
        tc = target.config
        mine = self.eagle.target
        for field in ("hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(tc, field) != getattr(mine, field):
                raise ValueError(f"draft: EAGLE head was trained for a target with {field}={getattr(mine, field)}, "
                                 f"this target has {getattr(tc, field)}")
        depth = target_layers or tc.num_layers
        if self.eagle.aux_layers[-1] >= depth:
            raise ValueError(f"draft: EAGLE head reads target layer {self.eagle.aux_layers[-1]}, "
                             f"the target has {depth}")
        self._target = (target,)
        return self

    @property
    def target(self) -> LlamaForCausalLM:
        if not self._target:
            raise RuntimeError("EagleHead: attach(target) first")
        return self._target[0]

    def fuse_features(self, aux: torch.Tensor) -> torch.Tensor:
        """aux: [N, aux_size] target aux features -> [N, hidden] head features."""
        return self.fuse(aux.to(self.fuse.weight.dtype))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                features: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: [T]; features: [T, hidden] (f_{p-1} per entry) -> outputs g [T, hidden];
        ``keep`` [N] long: every entry writes its K/V, only these rows go on past the attention -> [N, hidden]."""
        emb = self.target.model.embed_tokens(input_ids)
        x = self.proj(ops.rms_norm_pair(emb, self.embed_norm.weight, features, self.feature_norm.weight, self.eps))
        x, delta = self.layer(x, self.target.model.rotary.lookup(positions), attn, None, keep)
        return x + delta

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] head outputs -> logits [N, vocab] float32 through the target's LM head."""
        return self.lm_logits(hidden).float()

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """As ``compute_logits``, in the model's dtype (``LlamaForCausalLM.lm_logits``)."""
        return self.target.lm_logits(self.norm(hidden))


def save_eagle(head: EagleHead, directory: Path, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({**head.eagle.to_json(), **(extra or {})}, indent=2) + "\n")


def load_eagle(directory: Path, target: LlamaForCausalLM, device: torch.device | str,
               dtype: torch.dtype, target_layers: int | None = None) -> EagleHead:
    from safetensors.torch import load_file

    cfg = EagleConfig.from_json(json.loads((directory / "config.json").read_text()))
    head = build_empty(lambda: EagleHead(cfg), device, dtype)
    state = load_file(str(directory / "model.safetensors"), device=str(device))
    expected = set(head.state_dict())
    if set(state) != expected:
        raise ValueError(f"draft: {directory} holds weights {sorted(set(state) ^ expected)[:6]} that do not match "
                         "an EAGLE head")
    head.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return head.attach(target, target_layers).eval().requires_grad_(False)

"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2 with qkv bias): layers composed, nothing else.

Attention goes through whatever ``AttentionBackend`` the caller planned for this forward;
the model knows nothing of KV pages, batching or speculative phases.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from engine.attention.base import AttentionBackend
from engine.config import ModelConfig
from engine.models import ops
from engine.models.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary
from engine.models.meta import on_meta


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                attn: AttentionBackend, keep: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, hidden]; rope: RotaryEmbedding.lookup(positions); keep: [N] long token rows (None: all)
        # -> [T or N, hidden]: every token writes its K/V, only the kept rows go on through o_proj
        qkv = self.qkv_proj(x)
        t, d = qkv.shape[0], self.head_dim
        if attn.fused_rotary:  # the backend rotates q and k itself, in the launch that writes the KV
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            o = attn.forward(self.layer, q.view(t, -1, d), k.view(t, -1, d), v.view(t, -1, d), rope)
        else:
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = apply_rotary(qk.view(t, -1, d), rope)  # [T, Hq + Hkv, D]: one pass for q and k
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
            o = attn.forward(self.layer, q, k, v.view(t, -1, d))
        o = o.reshape(-1, self.q_size)
        return self.o_proj(o if keep is None else o[keep])


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, rope, attn, delta: torch.Tensor | None = None,
                keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] residual stream; delta: the previous layer's output not yet added to it (None: none).
        Returns (residual stream, this layer's MLP output not yet added): the next norm adds it in one step.
        keep: [N] long, the token rows that go on past the attention (every token still writes its K/V; the
        rest of the layer and both outputs are [N, hidden]); None: all."""
        x, h = self.input_layernorm.add(x, delta)
        o = self.self_attn(h, rope, attn, keep)
        x, h = self.post_attention_layernorm.add(x if keep is None else x[keep], o)
        return x, self.mlp(h)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # built on meta (engine/models/meta.py), no random init: there it writes nothing and imports torch._dynamo
        shape = (cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape) if on_meta() else None)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position, cfg.rope_theta, cfg.rope_scaling)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: [T] -> final hidden states [T, hidden] (after the final norm); ``keep`` [N]
        long: only these token rows go on past the last layer's attention (every token writes its K/V in every
        layer) -> [N, hidden]."""
        return self.forward_aux(input_ids, positions, attn, (), keep)[0]

    def forward_aux(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBackend,
                    aux_layers: Sequence[int], keep: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Also return the residual stream after each layer in ``aux_layers`` (the features an
        EAGLE head drafts from): final hidden [T, hidden], aux [T, len(aux_layers) * hidden] or None.
        ``keep``: as in ``forward``, which the last layer's aux features cannot be taken with."""
        m = self.model
        last = len(m.layers) - 1
        if keep is not None and last in aux_layers:
            raise ValueError(f"aux_layers: layer {last} (the last) has only the kept rows")
        x, delta = m.embed_tokens(input_ids), None
        aux = []
        rope = m.rotary.lookup(positions)
        for i, layer in enumerate(m.layers):
            x, delta = layer(x, rope, attn, delta, keep if i == last else None)
            if i in aux_layers:
                aux.append(x + delta)  # the residual stream after layer i
        return m.norm.add(x, delta)[1], (torch.cat(aux, dim=-1) if aux_layers else None)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] -> logits [N, vocab] in float32."""
        return self.lm_logits(hidden).float()

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] -> logits [N, vocab] in the model's dtype: what an argmax needs (float32 holds
        every 16-bit value exactly, so the order is the same), without the [N, vocab] float32 copy."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return ops.lm_head(hidden, weight)

    def truncated(self, num_layers: int) -> "LlamaForCausalLM":
        """A view with the first ``num_layers`` layers, sharing every weight (layer-skip draft)."""
        view = LlamaForCausalLM.__new__(LlamaForCausalLM)
        nn.Module.__init__(view)
        view.config = self.config.truncated(num_layers)
        view.model = LlamaModel.__new__(LlamaModel)
        nn.Module.__init__(view.model)
        view.model.embed_tokens = self.model.embed_tokens
        view.model.layers = nn.ModuleList(self.model.layers[:num_layers])
        view.model.norm = self.model.norm
        view.model.rotary = self.model.rotary
        view.lm_head = self.lm_head
        return view

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors, fusing q/k/v and gate/up as they arrive."""
        params = dict(self.named_parameters())
        pending: dict[str, dict[str, torch.Tensor]] = {}
        fused = {"q_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                 "k_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                 "v_proj": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
                 "gate_proj": ("gate_up_proj", ("gate_proj", "up_proj")),
                 "up_proj": ("gate_up_proj", ("gate_proj", "up_proj"))}
        loaded: set[str] = set()
        for name, tensor in weights:
            if name == "rope_freqs":
                self.model.rotary.rebuild(tensor)
                continue
            if name == "lm_head.weight" and self.lm_head is None:
                continue  # some tied checkpoints store the head anyway
            parts = name.split(".")
            if len(parts) >= 2 and parts[-2] in fused:
                target, members = fused[parts[-2]]
                key = ".".join(parts[:-2] + [target, parts[-1]])
                group = pending.setdefault(key, {})
                group[parts[-2]] = tensor
                if len(group) < len(members):
                    continue
                name, tensor = key, torch.cat([group[m_] for m_ in members], dim=0)
                del pending[key]
            if name not in params:
                raise ValueError(f"unexpected weight {name!r} for {self.config.name}")
            param = params[name]
            if param.shape != tensor.shape:
                raise ValueError(f"weight {name}: shape {tuple(tensor.shape)} != expected {tuple(param.shape)}")
            with torch.no_grad():
                param.copy_(tensor)
            loaded.add(name)
        missing = set(params) - loaded
        if pending or missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing | set(pending))[:8]}")

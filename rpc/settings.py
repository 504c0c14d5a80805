"""Edge configuration with pydantic-settings: ``TANDEM_*`` environment variables, flags override.

Every service reads the same variable names (one ConfigMap can feed them all); each is
validated once at startup and turned into the engine's frozen dataclasses.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.config import EngineConfig


def _none_word(value: object) -> object:
    """``none`` (any case) or an empty value, from a TANDEM_* variable or a flag, means None."""
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    return value


# an optional number that the environment and the flags can also turn off with "none"
OptionalInt = Annotated[int | None, BeforeValidator(_none_word)]


class TandemSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TANDEM_", extra="forbid", frozen=True)


class ServerSettings(TandemSettings):
    host: str = Field("0.0.0.0", description="address to listen on")
    metrics_port: OptionalInt = Field(None, ge=0, le=65535, description="Prometheus /metrics port (none: off)")
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="largest gRPC message accepted")
    grace_s: float = Field(5.0, ge=0, description="seconds to finish in-flight RPCs on shutdown")


class EngineSettings(ServerSettings):
    model: str | None = Field(None, description="target GGUF file, Hugging Face directory or synthetic:NAME "
                                                "(default SmolLM2)")
    draft: str = Field("auto", description="auto (the trained drafter shipped for the model, else ngram), "
                                           "ngram[:N], layerskip:N, PATH or none")
    k: int = Field(4, ge=0, le=32, description="default draft tokens per round")
    max_k: int = Field(8, ge=0, le=32, description="largest k a request may ask for")
    device: str | None = Field(None, description="cpu or cuda[:N] (default cuda when present)")
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    attention: Literal["auto", "torch", "flashinfer"] = "auto"
    kv_cache_tokens: OptionalInt = Field(None, ge=16)
    max_batch_size: int = Field(64, ge=1)
    draft_top_m: int = Field(32, ge=0, description="sampled drafts cross the wire as their top m tokens")
    max_round_tokens: OptionalInt = Field(None, ge=16, description="token budget of one target forward (chunked "
                                                                   "prefill); none: no budget")
    enforce_eager: bool = Field(False, description="no CUDA graphs for decode steps")
    spec_max_batch: OptionalInt = Field(3, ge=0, description="fused rounds speculate only while at most this many "
                                                             "requests run (none: always)")
    pipeline_max_batch: OptionalInt = Field(None, ge=0, description="fused rounds of at most this many requests "
                                            "launch the next round before this one is read (0: never; none: 8 "
                                            "where rounds are captured CUDA graphs)")

    @model_validator(mode="after")
    def _k_within_max(self):
        if self.k > self.max_k:
            raise ValueError(f"k ({self.k}) must not exceed max_k ({self.max_k})")
        return self

    def engine_config(self) -> EngineConfig:
        from engine.factory import default_device, default_dtype

        device = self.device or default_device()
        return EngineConfig(device=device, dtype=self.dtype or default_dtype(device), attention=self.attention,
                            kv_cache_tokens=self.kv_cache_tokens, max_batch_size=self.max_batch_size,
                            max_k=self.max_k, k=self.k, draft_top_m=self.draft_top_m,
                            max_round_tokens=self.max_round_tokens,
                            cuda_graphs=False if self.enforce_eager else None, spec_max_batch=self.spec_max_batch,
                            pipeline_max_batch=self.pipeline_max_batch)


def load(cls: type[TandemSettings], **flags) -> TandemSettings:
    """Settings from the environment, overridden by flags that were given (None = not given)."""
    try:
        return cls(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors())
        raise ValueError(problems) from None

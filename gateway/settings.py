"""Gateway settings (TANDEM_* environment variables; flags override)."""

from __future__ import annotations

from pydantic import Field, field_validator

from gateway.discovery import Target, parse_targets
from rpc.settings import DraftLengthSettings, ServerSettings


class GatewaySettings(ServerSettings, DraftLengthSettings):
    gateway_port: int = Field(50051, ge=0, le=65535, description="gRPC port of the gateway")
    verifier_address: str = Field("localhost:50052", description="host:port of the verifier replicas: a list "
                                  "(comma-separated), and/or names whose DNS records are the replicas (a headless "
                                  "Service)")
    drafter_address: str = Field("localhost:50053", description="host:port of the drafter replicas (split mode), "
                                 "as for verifier_address")
    discovery_interval_s: float = Field(5.0, gt=0, description="how often the names in the address settings are "
                                                                "resolved again (replicas come and go)")
    verifier_probe_s: float = Field(1.0, gt=0, description="health-check period of each verifier replica; one that "
                                                            "fails twice in a row is lost and its requests move")
    colocated: bool = Field(False, description="the verifiers run the rounds over Serve streams: each drafts itself "
                            "(co-located) or through a drafter service of its own (verifier --drafter-address); the "
                            "gateway calls no drafter")
    model: str | None = Field(None, description="model whose tokenizer and chat template the gateway uses")
    max_batch_size: int = Field(64, ge=1, description="requests per round")
    max_queue: int = Field(256, ge=0, description="requests waiting beyond the batch before RESOURCE_EXHAUSTED")
    max_tokens_limit: int = Field(4096, ge=1, description="largest max_tokens a request may ask for")
    max_prompt_bytes: int = Field(1 << 20, ge=1, description="largest prompt (text, messages or ids) in bytes")
    max_stop_strings: int = Field(16, ge=0, description="most stop strings a request may give (each is checked "
                                                        "against every token it commits)")
    max_stop_chars: int = Field(256, ge=1, description="longest stop string a request may give, in characters")
    draft_timeout_s: float = Field(2.0, gt=0, description="deadline of a Draft RPC; late drafts mean plain decoding")
    verify_timeout_s: float = Field(120.0, gt=0, description="deadline of a Verify RPC (one round)")
    prefill_timeout_s: float = Field(900.0, gt=0, description="deadline of a Prefill RPC (a prompt, however long; "
                                                              "past it that prompt fails alone)")
    wait_s: float = Field(300.0, gt=0, description="longest a request waits for a verifier (none up, or restarting) "
                                                   "or for KV room when its call has no deadline of its own")
    early_draft: bool = Field(True, description="draft round r+1 while round r is verified (split mode)")
    drafter_probe_s: float = Field(1.0, gt=0, description="health-check period of each drafter replica")
    api_keys_file: str | None = Field(None, description="clients must send 'authorization: Bearer KEY' with a key "
                                      "of this file: one per line, optionally followed by the most calls it may have "
                                      "in flight at once (rpc/auth.py); health stays open. None: anyone who reaches "
                                      "the gateway, allowed on a loopback host, with api_open or with insecure")
    api_open: bool = Field(False, description="serve clients without API keys beyond loopback too (behind a proxy "
                           "that authenticates them, or on a network you trust), the services still speaking mutual "
                           "TLS; off: without api_keys_file the gateway listens on loopback only")
    api_tls_cert_file: str | None = Field(None, description="client-facing TLS: the gateway's server certificate, PEM "
                                          "(clients need no certificate); none: plaintext")
    api_tls_key_file: str | None = Field(None, description="the private key of api_tls_cert_file, PEM")
    feature_window: int = Field(1024, ge=1, description="a feature-fed drafter (EAGLE head) gets at most this many "
                                                        "of a request's latest target features at once")

    @field_validator("verifier_address", "drafter_address")
    @classmethod
    def _addresses(cls, value: str) -> str:
        parse_targets(value)  # ValueError: pydantic names the field
        return value

    def verifier_targets(self) -> list[Target]:
        return parse_targets(self.verifier_address)

    def drafter_targets(self) -> list[Target]:
        return parse_targets(self.drafter_address)

"""Verifier settings (TANDEM_* environment variables; flags override)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rpc.settings import ServiceEngineSettings


class VerifierSettings(ServiceEngineSettings):
    verifier_port: int = Field(50052, ge=0, le=65535, description="gRPC port of the verifier")
    draft: str = Field("none", description="embedded drafter for co-located Step (none: split mode only)")
    # not drafter_address: the gateway's TANDEM_DRAFTER_ADDRESS (one ConfigMap for all three) must not reach it
    direct_drafter_address: str | None = Field(
        None, description="host:port of a drafter service this verifier calls itself each round (split mode with the "
        "rounds run here, over Serve streams, as co-located; draft must be none); none: no drafter of its own")
    draft_timeout_s: float = Field(2.0, gt=0, description="deadline of a Draft call to direct_drafter_address; a "
                                   "late or failed one means plain decoding for that round")
    drafter_retry_s: float = Field(1.0, gt=0, description="after a failed Draft call, rounds decode plainly this "
                                   "long before the drafter is called again")
    drafter_connect_s: float = Field(300.0, gt=0, description="how long start-up waits for direct_drafter_address "
                                     "to answer (it tells the verifier which target features it drafts from)")
    engine_process: bool = Field(True, description="run the engine in a process of its own beside the gRPC server "
                                 "(its rounds then never wait for the GIL the server's threads hold); off: on a thread "
                                 "of the server's process")
    local_draft: Literal["ngram", "none"] = Field(
        "ngram", description="with direct_drafter_address: the verifier's own drafter for the requests whose "
        "rounds with that drafter were measured not to pay (their Draft call and eager verify cost more than the "
        "tokens they add): ngram, prompt lookup inside the round's CUDA graph (1.2-1.5x plain decoding at one "
        "request on an H100, bench/RESULTS.md); none: those requests decode plainly")
    feature_window: int = Field(1024, ge=1, description="a feature-fed drafter at direct_drafter_address gets at "
                                "most this many of a request's latest target features at once")

    @model_validator(mode="after")
    def _one_drafter(self):
        if self.direct_drafter_address and self.draft.strip() != "none":
            raise ValueError(f"draft: {self.draft!r} and direct_drafter_address: give one (an embedded drafter, or a "
                             "drafter service the verifier calls)")
        return self

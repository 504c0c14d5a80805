"""Verifier settings (TANDEM_* environment variables; flags override)."""

from __future__ import annotations

from pydantic import Field

from rpc.settings import ServiceEngineSettings


class VerifierSettings(ServiceEngineSettings):
    verifier_port: int = Field(50052, ge=0, le=65535, description="gRPC port of the verifier")
    draft: str = Field("none", description="embedded drafter for co-located Step (none: split mode only)")

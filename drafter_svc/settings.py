"""Drafter settings (TANDEM_* environment variables; flags override)."""

from __future__ import annotations

from pydantic import Field

from rpc.settings import ServiceEngineSettings


class DrafterSettings(ServiceEngineSettings):
    drafter_port: int = Field(50053, ge=0, le=65535, description="gRPC port of the drafter")

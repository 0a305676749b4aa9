"""Gateway settings, from `BANDGATE_*` environment variables (pydantic-settings)."""

from __future__ import annotations

from pydantic import Field

from topology.settings import BrokerSettings


class GatewaySettings(BrokerSettings):
    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, description="uvicorn worker processes")
    publish_timeout_seconds: float = Field(
        default=5.0, gt=0, description="how long to wait for the broker's confirm before a 503"
    )
    max_body_bytes: int = Field(default=256 * 1024, gt=0, description="larger bodies get 413")
    max_batch_messages: int = Field(default=100, ge=1, description="larger batches get 413")
    channel_pool_size: int = Field(default=4, ge=1, description="confirm channels shared")
    declare_topology: bool = Field(
        default=True, description="apply the topology on connect (idempotent)"
    )
    connection_name: str = "bandgate-gateway"

"""Gateway settings, from `BANDGATE_*` environment variables (pydantic-settings)."""

from __future__ import annotations

from pydantic import Field

from bandgate.gateway.auth import TokenSpec
from bandgate.topology.publish_input import MAX_BODY_BYTES
from bandgate.topology.settings import BrokerSettings


class GatewaySettings(BrokerSettings):
    host: str = Field(default="127.0.0.1", description="address the HTTP server binds")
    port: int = Field(default=8000, ge=0, le=65535, description="port the HTTP server binds")
    workers: int = Field(
        default=1,
        ge=1,
        description="uvicorn worker processes; every per-token budget and rate limit is "
        "counted per process. On 2 cores shared with the broker, 2 processes published 5 % "
        "fewer to 25 % more single messages per second than one (docs/benchmarks.md)",
    )
    publish_timeout_seconds: float = Field(
        default=5.0, gt=0, description="how long to wait for the broker's confirm before a 503"
    )
    max_body_bytes: int = Field(
        default=MAX_BODY_BYTES, gt=0, description="larger bodies get 413 (the producer's too)"
    )
    max_batch_messages: int = Field(default=100, ge=1, description="larger batches get 413")
    channel_pool_size: int = Field(
        default=1,
        ge=1,
        description="confirm channels a process publishes on, taking turns a loop turn each; "
        "one published 1-25 % more single messages per second than four here "
        "(docs/benchmarks.md)",
    )
    declare_topology: bool = Field(
        default=True, description="apply the topology on connect (idempotent)"
    )
    max_header_bytes: int = Field(
        default=32 * 1024, ge=1024, description="request line and headers; larger get 431"
    )
    max_connections: int = Field(
        default=1000, ge=1, description="open connections and requests; beyond, uvicorn says 503"
    )
    keep_alive_seconds: int = Field(
        default=5, ge=1, description="for an idle keep-alive connection, and to send a request head"
    )
    http_shutdown_grace_seconds: int = Field(
        default=10, ge=1, description="on SIGTERM, requests still running then are cancelled"
    )
    auth_failures_per_minute: int = Field(
        default=60, ge=1, description="failed authentications per client address; then 429"
    )
    access_log: bool = Field(
        default=True, description="log every request (costs CPU at high request rates)"
    )
    allowed_hosts: tuple[str, ...] = Field(
        default=(),
        description="JSON list of the host names the gateway serves (any when empty; "
        "bandgate dev: its own address); another Host gets 403",
    )
    allowed_origins: tuple[str, ...] = Field(
        default=(),
        description="JSON list of web origins (https://ops.example.com) whose pages may send "
        "state-changing requests; other sites get 403",
    )
    connection_name: str = Field(
        default="bandgate-gateway", description="the AMQP connection's name in the management UI"
    )
    auth_enabled: bool = Field(
        default=True, description="require bearer tokens on /v1/ (bandgate dev turns it off)"
    )
    tokens: tuple[TokenSpec, ...] = Field(
        default=(),
        description='JSON list of {"name", "sha256", "scopes", "rate_per_second"}; '
        "`bandgate token new` prints one",
    )
    rate_limit_per_second: float | None = Field(
        default=None,
        gt=0,
        description="default per-token rate in messages per second (per process); a batch "
        "costs one per message",
    )
    rate_limit_burst: int = Field(default=100, ge=1, description="token bucket size")
    max_dlq_operations_per_token: int = Field(
        default=2,
        ge=1,
        description="dead-letter operations (list, replay, purge) one token may run at once, "
        "per process; all tokens together at most a quarter of max_connections; then 429 "
        "too_many_dlq_operations",
    )
    max_tombstones_per_token: int = Field(
        default=10_000,
        ge=1,
        description="tombstones (cancels, replaces, escalates) one token may write per process "
        "in the ledger's retention window; then 429 too_many_tombstones. Keep tokens x "
        "processes x this x 290 bytes below the ledger's max_bytes (docs/guides/limits.md)",
    )

"""Settings of HTTP receivers, from `BANDGATE_PULL_*` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from bandgate.consumers import IDLE_AFTER
from bandgate.core.ledger import CATCHUP_SECONDS

# SQS's bounds, which HTTP clients of queues know: visibility up to 12 hours, long polls up to
# 20 s, 10 messages per receive.
MAX_VISIBILITY_SECONDS = 43_200
MAX_WAIT_SECONDS = 20
MAX_MESSAGES = 10


class PullSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="BANDGATE_PULL_", extra="ignore")

    max_leases: int = Field(
        default=256,
        ge=1,
        le=65_535,
        description="messages one gateway process holds leased per queue; also each band's "
        "prefetch while clients wait",
    )
    max_leases_per_token: int = Field(
        default=128,
        ge=1,
        description="leases one token may hold at once, per process; never more than half of "
        "max_leases, so that one token cannot hold every lease of a queue",
    )
    max_waiting_per_token: int = Field(
        default=32,
        ge=1,
        description="receives (long polls) one token may have open at once, per process; "
        "never more than a quarter of BANDGATE_MAX_CONNECTIONS, and all tokens together at "
        "most half of it",
    )
    default_visibility_seconds: float = Field(
        default=30, gt=0, le=MAX_VISIBILITY_SECONDS, description="when a receive names none"
    )
    max_response_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="a receive stops taking messages once their payloads reach this (the "
        "first always comes)",
    )
    linger_seconds: float = Field(
        default=0.1,
        ge=0,
        description="how long a process keeps consuming after its last waiting receive",
    )
    cold_boost_seconds: float = Field(
        default=IDLE_AFTER,
        ge=0,
        description="while a hotter message arrived this recently, cold leases leave enough "
        "receives waiting for hotter work (consumers.scheduling); 0: cold leases take any seat",
    )
    ledger_catchup_seconds: float = Field(
        default=CATCHUP_SECONDS,
        gt=0,
        description="at the first receive, how long to wait for the tombstone ledger to be "
        "read up to now; past it receivers serve anyway, and /readyz says they do not follow it",
    )
    forward_timeout_seconds: float = Field(
        default=5.0, gt=0, description="for the process holding a lease to answer a forward"
    )

    @property
    def token_lease_limit(self) -> int:
        """The leases one token may hold in this process: its own limit, capped at half of a
        queue's, so the other tokens of a queue always find seats."""
        return max(1, min(self.max_leases_per_token, self.max_leases // 2))

    def receive_seats(self, max_connections: int) -> tuple[int, int]:
        """(per token, all tokens): the receives open at once in a process that serves
        `max_connections` connections and requests (uvicorn's `limit_concurrency`; beyond it
        every request gets 503 `server_busy`, a publish of any tenant included).

        Receives of all tokens take at most half of the connections, so publishes, settles and
        stats always find the other half; one token at most a quarter, so it leaves room for
        other receivers too. With the defaults (1000 connections): 32 per token, 500 in all,
        so 15 tokens may each hold their 32 at once."""
        per_token = max(1, min(self.max_waiting_per_token, max_connections // 4))
        return per_token, max(per_token, max_connections // 2)


__all__ = ["MAX_MESSAGES", "MAX_VISIBILITY_SECONDS", "MAX_WAIT_SECONDS", "PullSettings"]

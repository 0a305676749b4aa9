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
    max_prefetch_bytes: int = Field(
        default=64 << 20,
        ge=1 << 20,
        description="bytes of one queue's messages a process holds at most, leased or "
        "prefetched: each band's prefetch is this / (bands x BANDGATE_MAX_BODY_BYTES), at "
        "least 10 and at most max_leases",
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
    hold_seconds: float = Field(
        default=5.0,
        ge=0,
        description="before RabbitMQ 4.3, how long a paused process keeps the messages it "
        "holds unleased for its next receive; then it gives them back, uncounted, as copies "
        "at the back of their band, for other processes and workers (4.3 gives them back, "
        "in place, at the pause)",
    )
    cold_boost_seconds: float = Field(
        default=IDLE_AFTER,
        ge=0,
        description="while a hotter message arrived this recently, cold leases leave enough "
        "receives waiting for hotter work (consumers.scheduling); 0: cold leases take any seat",
    )
    hot_reserve: int = Field(
        default=0,
        ge=0,
        description="leases of a queue (per process) the coldest band never takes, kept for "
        "hotter bands even after a quiet spell: while receivers keep that many receives "
        "waiting, the first hot message after a quiet spell is received at once instead of "
        "after a cold lease ends; cold work then holds at most max_leases minus this",
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
    fast_frames: bool = Field(
        default=False,
        description="read deliveries' frames with bandgate's decoder (core.protocol.frames), "
        "put in place of pamqp's for the whole process when the receivers start, as a worker "
        "does (BANDGATE_FAST_FRAMES): on in `bandgate gateway`, whose process is the gateway's "
        "alone, unless set to false; off in a program that serves the gateway app itself",
    )

    @property
    def token_lease_limit(self) -> int:
        """`token_leases` of a queue that may lease `max_leases`."""
        return self.token_leases(self.max_leases)

    def token_leases(self, queue_leases: int) -> int:
        """The leases one token may hold in this process: its own limit, capped at half of the
        queue's (`queue_leases`), so the other tokens of a queue always find seats."""
        return max(1, min(self.max_leases_per_token, queue_leases // 2))

    def queue_leases(self, bands: int, max_message_bytes: int) -> int:
        """The messages a process holds of a queue with `bands` bands, per band: its prefetch,
        which bounds the leased and the prefetched ones together (the broker counts both as
        unacked), and the queue's leases. Bounded in bytes: the broker cannot bound a prefetch
        in bytes, and before this one `receive` of one message pulled up to 256 messages of
        each band into the gateway (300 x 250 KB: RSS 101 -> 174 MB). So every band's prefetch
        times the largest message the gateway accepts (`max_message_bytes`, its body limit)
        stays within `max_prefetch_bytes`, but for a floor of a full receive (`MAX_MESSAGES`),
        and at most `max_leases`.
        Defaults: 64 MiB / (3 bands x 256 KiB) = 85 per band."""
        by_bytes = self.max_prefetch_bytes // (bands * max_message_bytes)
        return min(self.max_leases, max(MAX_MESSAGES, by_bytes))

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

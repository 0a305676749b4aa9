"""Worker settings, from `BANDGATE_*` environment variables or arguments (pydantic-settings)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bandgate.consumers.scheduling import IDLE_AFTER
from bandgate.core.ledger import CATCHUP_SECONDS
from bandgate.topology import naming
from bandgate.topology.settings import BrokerSettings

EventLoopName = Literal["auto", "uvloop", "asyncio"]


class WorkerSettings(BrokerSettings):
    concurrency: int | None = Field(
        default=None, ge=1, description="handlers run at once per consumer; overrides the code"
    )
    shutdown_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="on SIGTERM, how long running handlers may take to finish before they are "
        "cancelled and their messages returned",
    )
    confirm_timeout_seconds: float = Field(
        default=5.0, gt=0, description="wait for the broker's confirm of a retry or dead letter"
    )
    startup_prime_seconds: float = Field(
        default=2.0,
        ge=0,
        description="at start-up, how long to wait for a band's first prefetch before consuming "
        "the next colder band (keeps a backlog's start order strict)",
    )
    refill_wait_seconds: float = Field(
        default=0.1,
        ge=0,
        description="how long a free slot waits for a backlogged hotter band's refill before "
        "it starts colder work (quorum queues can take tens of ms to process an ack)",
    )
    cold_boost_seconds: float = Field(
        default=IDLE_AFTER,
        ge=0,
        description="once no hotter message arrived for this long, the coldest band may fill "
        "every slot; until then it leaves a headroom sized from hotter work's use of the "
        "slots (consumers.scheduling); 0: no headroom, the coldest band keeps a prefetch of C/4",
    )
    share_shards_seconds: float = Field(
        default=1.0,
        gt=0,
        description="ordered sharded queues: how often a worker checks that it holds no more "
        "than its share of a band's shards (see consumers.sharing)",
    )
    connect_timeout_seconds: float = Field(
        default=30.0, ge=0, description="at start-up, how long to retry reaching the broker"
    )
    reconnect_interval_seconds: float = Field(
        default=1.0, gt=0, description="pause before reconnecting after the connection dropped"
    )
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="serve Prometheus /metrics on this port"
    )
    metrics_host: str = Field(default="127.0.0.1", description="address the metrics port binds")
    declare_topology: bool = Field(
        default=True, description="apply the topology on start (idempotent)"
    )
    follow_ledger: bool = Field(
        default=True,
        description="follow the tombstone ledger, so cancelled and replaced messages are "
        "skipped (off: every copy runs, and `dedupe` cannot work)",
    )
    ledger_catchup_seconds: float = Field(
        default=CATCHUP_SECONDS,
        gt=0,
        description="at start-up, how long to wait for the ledger to be read up to now; past "
        "it the worker starts anyway and says it does not follow the ledger",
    )
    fast_frames: bool | None = Field(
        default=None,
        description="read deliveries' frames with bandgate's decoder (core.protocol.frames), "
        "put in place of pamqp's for the whole process when the worker starts. Unset: on in the "
        "`bandgate worker` command, whose process is the worker's alone, and off in a program "
        "that runs a ConsumerApp itself, whose other AMQP clients it must not touch",
    )
    event_loop: EventLoopName = Field(
        default="auto",
        description="the event loop: uvloop when installed (auto), as uvicorn does; it cuts "
        "the worker's CPU per message by about a quarter (bench/)",
    )
    connection_name: str = Field(
        default=naming.WORKER_CONNECTION,
        description="the AMQP connection's name in the management UI",
    )

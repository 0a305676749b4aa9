"""Following the tombstone ledger (`core.ledger`) into one process's `LedgerView`.

A process reads the stream from the start of its retention, then follows it. To know when it
has caught up, it writes a `mark` entry of its own and waits for it to come back: every entry
written before the mark has been applied by then. After a reconnection it consumes again from
the offset after the last one it applied, once a mark it writes is confirmed: a stream consumed
a moment after a broker restart, before its writer started, makes RabbitMQ (seen on 4.3.6) close
the whole connection with 541 INTERNAL_ERROR, and the gateway's publishers and receivers share
it; a confirmed write says the writer runs. A process that cannot read the ledger says so: the
`bandgate_ledger_following` gauge is 0, `problem` says why (the gateway's /readyz shows it),
and a warning is logged; it keeps working, without skipping anything.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractRobustChannel
from aiormq.abc import DeliveredMessage

from bandgate.core.ledger import LedgerEntryError, LedgerView, decode, mark
from bandgate.core.publishing import Publisher
from bandgate.core.telemetry import Telemetry
from bandgate.topology import naming
from bandgate.topology.model import Topology

log = logging.getLogger(__name__)

# Entries in flight to this process: a stream consumer needs a prefetch, and acks grant credit.
# One ack (`multiple`) per ACK_EVERY entries: catching up on 100,000 entries read 22,000/s so,
# 14,200/s with an ack per entry (RabbitMQ 3.10.8, two cores).
PREFETCH = 2000
ACK_EVERY = 200
EXPIRE_EVERY_SECONDS = 60.0
REOPEN_SECONDS = 30.0  # after a reconnection, for the stream's writer to run again
REOPEN_RETRY_SECONDS = 0.2


class LedgerFollower:
    def __init__(
        self,
        connection: AbstractConnection,
        topology: Topology,
        publisher: Publisher,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.connection = connection
        self.publisher = publisher
        self.telemetry = telemetry
        self.stream = naming.ledger_stream(topology.exchange)
        self.view = LedgerView(topology.ledger.max_age_seconds)
        self.caught_up = asyncio.Event()
        self.problem: str | None = "not started"
        self._channel: AbstractChannel | None = None
        self._offset: int | None = None  # the last one applied
        self._unacked = 0
        self._mark = f"mark.{secrets.token_hex(12)}"
        self._expiry: asyncio.Task[None] | None = None
        self._again: asyncio.Task[None] | None = None
        self._update_gauges()

    @property
    def following(self) -> bool:
        return self.problem is None

    async def start(self, wait: float) -> bool:
        """Read from the start of the retention and wait up to `wait` s to catch up; False
        (with `problem` saying why, and a warning logged) when it could not."""
        try:
            channel = await self.connection.channel()
            self._channel = channel
            channel.close_callbacks.add(self._closed)
            if isinstance(channel, AbstractRobustChannel):
                channel.reopen_callbacks.add(self._reopened)
            await channel.set_qos(prefetch_count=PREFETCH)
            await self._consume()
            await self.publisher.record(mark(self._mark).encode())
            async with asyncio.timeout(wait):
                await self.caught_up.wait()
        except Exception as exc:
            self._lost(f"cannot read the tombstone ledger {self.stream!r}: {exc!r}")
            return False
        self.problem = None
        self._expiry = asyncio.create_task(self._expire_forever())
        self._update_gauges()
        log.info("following the ledger: %d tombstone(s) and handled id(s)", len(self.view))
        return True

    async def _consume(self) -> None:
        assert self._channel is not None
        underlay = await self._channel.get_underlay_channel()
        offset: Any = "first" if self._offset is None else self._offset + 1
        await underlay.basic_consume(
            self.stream,
            self._deliver,
            arguments={"x-stream-offset": offset},
            consumer_tag=f"bandgate.ledger.{secrets.token_hex(8)}",
        )

    async def _deliver(self, delivered: DeliveredMessage) -> None:
        headers = delivered.header.properties.headers or {}
        offset = headers.get("x-stream-offset")
        if not (isinstance(offset, int) and self._offset is not None and offset <= self._offset):
            self._apply(delivered.body)
            if isinstance(offset, int):
                self._offset = offset
        assert delivered.delivery_tag is not None  # consumed with acks
        self._unacked += 1
        if self._unacked >= ACK_EVERY:  # fewer than PREFETCH unacked: deliveries go on
            self._unacked = 0
            await delivered.channel.basic_ack(delivered.delivery_tag, multiple=True)

    def _apply(self, body: bytes) -> None:
        try:
            entry = decode(body)
        except LedgerEntryError as exc:
            log.warning("skipping a ledger entry: %s", exc)
            return
        if entry.op == "mark":
            if entry.message_id == self._mark:
                self.caught_up.set()
            return
        self.view.apply(entry)
        if self.telemetry is not None:
            self.telemetry.ledger_entries.set(len(self.view))

    def _closed(self, *_: Any) -> None:
        if self.caught_up.is_set() and self._channel is not None:
            self._lost("the ledger's channel closed; reading again once it reopens")

    def _reopened(self, *_: Any) -> None:
        """In a task of its own: the reconnection awaits this callback before it restores the
        connection's next channel, and the publisher's, which the mark needs, may be one."""
        if self._again is None or self._again.done():
            self._again = asyncio.create_task(self._follow_again())

    async def _follow_again(self) -> None:
        try:
            await self._writer_runs()
            await self._consume()
        except Exception as exc:
            self._lost(f"cannot read the tombstone ledger {self.stream!r} again: {exc!r}")
            return
        self.problem = None
        self._update_gauges()
        log.info("following the ledger again from offset %s", self._offset)

    async def _writer_runs(self) -> None:
        """Wait until a mark written to the stream is confirmed (see the module docstring);
        the last failure once `REOPEN_SECONDS` have passed."""
        deadline = asyncio.get_running_loop().time() + REOPEN_SECONDS
        while True:
            try:
                await self.publisher.record(mark(f"reopen.{secrets.token_hex(8)}").encode())
                return
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(REOPEN_RETRY_SECONDS)

    def _lost(self, problem: str) -> None:
        self.problem = problem
        self._update_gauges()
        log.warning("%s: cancelled and replaced messages are not skipped meanwhile", problem)

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(EXPIRE_EVERY_SECONDS)
            self.view.expire()
            self._update_gauges()

    def _update_gauges(self) -> None:
        if self.telemetry is not None:
            self.telemetry.ledger_following.set(1 if self.problem is None else 0)
            self.telemetry.ledger_entries.set(len(self.view))

    async def close(self) -> None:
        for task in (self._expiry, self._again):
            if task is not None:
                task.cancel()
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            try:
                await channel.close()
            except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
                log.debug("closing the ledger's channel: %r", exc)
        self.problem = "closed"


__all__ = ["LedgerFollower"]

"""Dead-letter tooling: count, list, replay and purge a logical queue's dead-letter queue.

Listing and replay read the DLQ through `gateway.dlq_access`, which returns every message it
does not ack, in order (RabbitMQ has no peek); what a dead letter says and what its replay
publishes is `gateway.dead_letter_records`.

Replay republishes a dead letter to its original band through the `Publisher` (confirmed) and
acks it from the DLQ only after the confirm: a failure can duplicate a message, never lose it.
Listing and replay read at most what the DLQ held when they started, so a message that fails
again while a replay runs is not replayed twice in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from gateway.dead_letter_records import DeadLetter, matches, read_dead_letter, replay_envelope
from gateway.dlq_access import DeadLetterError, depth, dlq_channel, holding, settle
from gateway.publishing import ChannelSet, Publisher, PublishFailure, confirm_channel_factory
from topology import naming, wire
from topology.model import QueueSpec, Topology


@dataclass(frozen=True)
class ReplayProgress:
    """Where a replay stands; `total` is what the DLQ held when it started (the most it reads)."""

    examined: int
    replayed: int
    skipped: int
    total: int


ProgressCallback = Callable[[ReplayProgress], None]


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did. Skipped messages did not match the filter; `kept` could not be
    replayed (each with why); `error` says why the replay stopped early. All of them are
    still in the dead-letter queue."""

    queue: str
    examined: int
    replayed: int
    skipped: int
    kept: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "examined": self.examined,
            "replayed": self.replayed,
            "skipped": self.skipped,
            "kept": list(self.kept),
            "error": self.error,
        }


async def count_dead_letters(connection: AbstractConnection, topology: Topology, queue: str) -> int:
    """Ready messages in the dead-letter queue of `queue`."""
    dlq = naming.dead_letter_queue(topology.queue(queue).name)
    async with dlq_channel(connection, dlq) as channel:
        return await depth(channel, dlq)


async def list_dead_letters(
    connection: AbstractConnection,
    topology: Topology,
    queue: str,
    *,
    limit: int = 100,
    reason: str | None = None,
    now: datetime | None = None,
) -> list[DeadLetter]:
    """Up to `limit` dead letters of `queue` (oldest first) matching `reason`; all stay put.

    Reads the whole DLQ (what it held when the call started) to keep its order.
    """
    spec = topology.queue(queue)
    dlq = naming.dead_letter_queue(spec.name)
    moment = now or wire.now()
    records: list[DeadLetter] = []
    async with dlq_channel(connection, dlq) as channel, holding(channel, dlq) as take:
        await take.start()
        while len(records) < limit and (message := await take()) is not None:
            record = _record(spec, message, moment)
            if matches(record, reason):
                records.append(record)
        await take.rest()
    return records


async def replay(
    connection: AbstractConnection,
    topology: Topology,
    queue: str,
    *,
    publisher: Publisher | None = None,
    limit: int | None = None,
    reason: str | None = None,
    rate: float | None = None,
    progress: ProgressCallback | None = None,
    confirm_timeout: float = 5.0,
) -> ReplayResult:
    """Republish dead letters of `queue` (matching `reason`, at most `limit`, at most `rate`
    per second) to their original bands; each is acked from the DLQ after its confirm.

    Without a `publisher`, one confirm channel of `connection` is used. Publishes are sequential,
    so replayed messages reach their bands in the DLQ's order; what stays keeps its order.
    """
    if rate is not None and rate <= 0:
        raise ValueError("rate must be positive")
    spec = topology.queue(queue)
    dlq = naming.dead_letter_queue(spec.name)
    own_channels = None
    if publisher is None:
        own_channels = ChannelSet(confirm_channel_factory(connection), size=1)
        publisher = Publisher(topology, own_channels, confirm_timeout)
    replayed = skipped = 0
    kept: list[str] = []
    error: str | None = None
    pace = _Pacer(rate)
    try:
        async with dlq_channel(connection, dlq) as channel, holding(channel, dlq) as take:
            total = await take.start()
            if progress is not None:
                progress(ReplayProgress(0, 0, 0, total))
            while (limit is None or replayed < limit) and (message := await take()) is not None:
                record = _record(spec, message, wire.now())
                envelope = (
                    replay_envelope(
                        spec, record, message.body, message.headers, message.content_type
                    )
                    if matches(record, reason)
                    else None
                )
                if envelope is None:
                    skipped += 1
                elif isinstance(envelope, str):
                    kept.append(f"{record.message_id}: {envelope}")
                else:
                    await pace.wait()
                    try:
                        await publisher.publish(envelope)
                    except PublishFailure as exc:
                        error = f"replaying message {record.message_id} failed: {exc}"
                        break
                    await settle(message.ack(), dlq)
                    take.settled(message)
                    replayed += 1
                if progress is not None:
                    progress(ReplayProgress(take.taken, replayed, skipped, total))
            examined = take.taken
            if error is None:
                await take.rest()
            else:  # best effort: the channel may be what failed
                with contextlib.suppress(DeadLetterError):
                    await take.rest()
    finally:
        if own_channels is not None:
            with contextlib.suppress(Exception):
                await own_channels.close()
    return ReplayResult(spec.name, examined, replayed, skipped, tuple(kept), error)


async def purge(connection: AbstractConnection, topology: Topology, queue: str) -> int:
    """Delete every ready message of the dead-letter queue of `queue`; how many there were."""
    dlq = naming.dead_letter_queue(topology.queue(queue).name)
    async with dlq_channel(connection, dlq) as channel:
        target = await settle(channel.get_queue(dlq, ensure=True), dlq)
        result = await settle(target.purge(), dlq)
    return int(result.message_count or 0)


class _Pacer:
    """Spaces calls `1/rate` seconds apart (no pacing without a rate)."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next: float | None = None

    async def wait(self) -> None:
        if not self._interval:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._next is not None and self._next > now:
            await asyncio.sleep(self._next - now)
            now = self._next
        self._next = now + self._interval


def _record(spec: QueueSpec, message: AbstractIncomingMessage, now: datetime) -> DeadLetter:
    return read_dead_letter(
        spec,
        message.headers,
        message_id=message.message_id,
        priority=message.priority,
        timestamp=message.timestamp,
        now=now,
    )


__all__ = [
    "ProgressCallback",
    "ReplayProgress",
    "ReplayResult",
    "count_dead_letters",
    "list_dead_letters",
    "purge",
    "replay",
]

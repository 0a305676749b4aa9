"""Dead-letter tooling: count, list, replay and purge a logical queue's dead-letter queue.

Listing and replay read the DLQ through `core.dlq_access`, which returns every message it
does not ack, in order (RabbitMQ has no peek); what a dead letter says and what its replay
publishes is `core.dead_letter_records`.

List, replay and purge of one DLQ take turns, across gateway processes and the CLI, through the
broker-side lock of `dlq_access.dlq_lock`: a purge never runs while a listing holds messages, and
a listing sees what a replay has not yet given back. Whoever waits longer than `lock_wait`
(10 s by default) gets `DeadLetterBusy` (HTTP 409 `dlq_busy`).

Replay republishes a dead letter to its original band through the `Publisher` (confirmed) and
acks it from the DLQ only after the confirm: a failure or a cancellation can duplicate a
message, never lose it. Pacing waits before the next message is taken, so a replay holds a
message it will replay only for the time of its publish. Listing and replay read at most what
the DLQ held when they started, so a message that fails again while a replay runs is not
replayed twice in the same run. Cancelling either (client gone, shutdown) gives every held
message back in order before the lock is released.

Bounds (the HTTP API and the CLI check them too): a listing shows `limit` 1-10,000 dead letters
(`MAX_LIST`); a replay replays at most `limit` 1-10,000 (`MAX_REPLAY`; none means all) at
`rate` 0.1-10,000 per second (`MIN_RATE`, `MAX_RATE`; none means as fast as confirms come); a
`reason` filter is at most 200 characters (`MAX_REASON`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aio_pika.abc import AbstractChannel, AbstractConnection

from bandgate.core.dead_letter_records import (
    DeadLetter,
    matches,
    read_dead_letter_message,
    replay_envelope,
)
from bandgate.core.dlq_access import (
    LOCK_WAIT_SECONDS,
    broker_call,
    depth,
    dlq_channel,
    dlq_lock,
    holding,
)
from bandgate.core.publishing import ChannelSet, Publisher, PublishFailure, confirm_channel_factory
from bandgate.topology import naming, wire
from bandgate.topology.model import QueueSpec, Topology

MAX_LIST = 10_000
MAX_REPLAY = 10_000
MIN_RATE = 0.1
MAX_RATE = 10_000.0
MAX_REASON = 200


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


@dataclass(frozen=True)
class DeadLetterList:
    """A listing: `total` dead letters in the DLQ when it was read, `records` the ones shown."""

    total: int
    records: tuple[DeadLetter, ...]


async def count_dead_letters(connection: AbstractConnection, topology: Topology, queue: str) -> int:
    """Ready messages in the dead-letter queue of `queue`, without the lock: a listing or
    replay running at the moment holds some of them. `read_dead_letters` counts under it."""
    dlq = naming.dead_letter_queue(topology.queue(queue).name)
    async with dlq_channel(connection, dlq) as channel:
        return await depth(channel, dlq)


async def read_dead_letters(
    connection: AbstractConnection,
    topology: Topology,
    queue: str,
    *,
    limit: int = 100,
    reason: str | None = None,
    now: datetime | None = None,
    lock_wait: float = LOCK_WAIT_SECONDS,
) -> DeadLetterList:
    """How many dead letters `queue` has, and up to `limit` of them (oldest first) matching
    `reason`; all stay put, in order. Reads the whole DLQ (what it held when the call
    started) to keep that order."""
    _check_bounds("limit", limit, 1, MAX_LIST)
    _check_reason(reason)
    spec = topology.queue(queue)
    dlq = naming.dead_letter_queue(spec.name)
    moment = now or wire.now()
    records: list[DeadLetter] = []
    async with _locked(connection, spec, lock_wait) as channel, holding(channel, dlq) as take:
        total = await take.start()
        while len(records) < limit and (message := await take()) is not None:
            record = read_dead_letter_message(spec, message, moment)
            if matches(record, reason):
                records.append(record)
    return DeadLetterList(total, tuple(records))


async def list_dead_letters(
    connection: AbstractConnection,
    topology: Topology,
    queue: str,
    *,
    limit: int = 100,
    reason: str | None = None,
    now: datetime | None = None,
    lock_wait: float = LOCK_WAIT_SECONDS,
) -> list[DeadLetter]:
    """The `records` of `read_dead_letters`."""
    listing = await read_dead_letters(
        connection, topology, queue, limit=limit, reason=reason, now=now, lock_wait=lock_wait
    )
    return list(listing.records)


async def replay(
    connection: AbstractConnection,
    topology: Topology,
    queue: str,
    *,
    publisher: Publisher | None = None,
    limit: int | None = None,
    reason: str | None = None,
    message_ids: Collection[str] | None = None,
    rate: float | None = None,
    progress: ProgressCallback | None = None,
    confirm_timeout: float = 5.0,
    lock_wait: float = LOCK_WAIT_SECONDS,
) -> ReplayResult:
    """Republish dead letters of `queue` (matching `reason`, and among `message_ids` when
    given; at most `limit`, at most `rate` per second) to their original bands; each is acked
    from the DLQ after its confirm.

    Without a `publisher`, one confirm channel of `connection` is used. Publishes are sequential,
    so replayed messages reach their bands in the DLQ's order; what stays keeps its order.
    """
    if limit is not None:
        _check_bounds("limit", limit, 1, MAX_REPLAY)
    if rate is not None:
        _check_bounds("rate", rate, MIN_RATE, MAX_RATE)
    _check_reason(reason)
    if message_ids is not None:
        _check_bounds("message_ids", len(message_ids), 1, MAX_REPLAY)
        wanted = frozenset(message_ids)
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
        async with _locked(connection, spec, lock_wait) as channel, holding(channel, dlq) as take:
            total = await take.start()
            if progress is not None:
                progress(ReplayProgress(0, 0, 0, total))
            while limit is None or replayed < limit:
                await pace.ready()  # before taking: nothing waits unacked for its turn
                if (message := await take()) is None:
                    break
                record = read_dead_letter_message(spec, message, wire.now())
                envelope = (
                    replay_envelope(
                        spec, record, message.body, message.headers, message.content_type
                    )
                    if matches(record, reason)
                    and (message_ids is None or record.message_id in wanted)
                    else None
                )
                if envelope is None:
                    skipped += 1
                elif isinstance(envelope, str):
                    kept.append(f"{record.message_id}: {envelope}")
                else:
                    pace.spent()
                    try:
                        await publisher.publish(envelope)
                    except PublishFailure as exc:
                        error = f"replaying message {record.message_id} failed: {exc}"
                        break
                    take.settled(message)
                    await broker_call(message.ack(), dlq)
                    replayed += 1
                if progress is not None:
                    progress(ReplayProgress(take.taken, replayed, skipped, total))
            examined = take.taken
    finally:
        if own_channels is not None:
            with contextlib.suppress(Exception):
                await own_channels.close()
    return ReplayResult(spec.name, examined, replayed, skipped, tuple(kept), error)


async def purge(
    connection: AbstractConnection,
    topology: Topology,
    queue: str,
    *,
    lock_wait: float = LOCK_WAIT_SECONDS,
) -> int:
    """Delete every message of the dead-letter queue of `queue`; how many there were. Under
    the lock, so none is out with a listing or a replay at the time."""
    spec = topology.queue(queue)
    dlq = naming.dead_letter_queue(spec.name)
    async with _locked(connection, spec, lock_wait) as channel:
        underlay = await broker_call(channel.get_underlay_channel(), dlq)
        result = await broker_call(underlay.queue_purge(dlq), dlq)
    return int(result.message_count or 0)


@contextlib.asynccontextmanager
async def _locked(
    connection: AbstractConnection, spec: QueueSpec, lock_wait: float
) -> AsyncIterator[AbstractChannel]:
    """A channel for the DLQ of `spec`, under its lock; the channel closes before the lock goes."""
    dlq = naming.dead_letter_queue(spec.name)
    lock = naming.dead_letter_lock(spec.name)
    async with dlq_lock(connection, lock, dlq, lock_wait), dlq_channel(connection, dlq) as channel:
        yield channel


def _check_bounds(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{name} must be {low:g}-{high:g}, not {value!r}")


def _check_reason(reason: str | None) -> None:
    if reason is not None and len(reason) > MAX_REASON:
        raise ValueError(f"reason must be at most {MAX_REASON} characters")


class _Pacer:
    """Keeps publishes `1/rate` seconds apart (no pacing without a rate). `ready` waits for
    the next slot before a message is taken; only a publish (`spent`) uses a slot up, so
    skipped messages are read at full speed."""

    def __init__(self, rate: float | None) -> None:
        self._interval = 1.0 / rate if rate else 0.0
        self._next = 0.0

    async def ready(self) -> None:
        if self._interval:
            delay = self._next - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)

    def spent(self) -> None:
        if self._interval:
            self._next = asyncio.get_running_loop().time() + self._interval


__all__ = [
    "MAX_LIST",
    "MAX_REASON",
    "MAX_REPLAY",
    "MAX_RATE",
    "MIN_RATE",
    "DeadLetterList",
    "ProgressCallback",
    "ReplayProgress",
    "ReplayResult",
    "count_dead_letters",
    "list_dead_letters",
    "purge",
    "read_dead_letters",
    "replay",
]

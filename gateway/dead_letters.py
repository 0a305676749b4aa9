"""Dead-letter tooling: list, replay and purge a logical queue's dead-letter queue.

RabbitMQ has no peek. Listing takes every message the DLQ holds with `basic.get`, keeps them
unacked, then returns them all with `basic.nack(requeue=True)`, one at a time in the order read:
nothing is lost, and the order is kept whichever way the broker requeues (quorum queues on 3.x,
and on 4.x where a delivery limit always applies, put returned messages ahead of the rest, behind
those returned before; 3.13 without a delivery limit puts them at the back). Reading all of it,
not only the first `limit`, is what keeps the order when part of the queue was returned before.
On 4.0-4.2 every return counts towards the delivery limit (default 20), and a DLQ without a
dead-letter exchange drops a message that reaches it; 4.3 stopped counting `basic.nack`.
`bandgate doctor` warns about it.

Replay republishes a dead letter to its original band through the `Publisher` (confirmed) and
acks it from the DLQ only after the confirm: a failure can duplicate a message, never lose it.
Listing and replay read at most what the DLQ held when they started, so a message that fails
again while a replay runs is not replayed twice in the same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from consumers.republish import carried_headers
from gateway.publishing import ChannelSet, Publisher, PublishFailure, confirm_channel_factory
from topology import naming, wire
from topology.model import QueueSpec, Topology
from topology.priority import MAX_PRIORITY, MIN_PRIORITY
from topology.wire import (
    ATTEMPTS,
    FAILED_AT,
    FAILURE_CAUSE,
    FAILURE_REASON,
    FAILURE_TYPE,
    ORIGINAL_BAND,
)

REPLAYS = wire.REPLAYS

GET_TIMEOUT_SECONDS = 10.0

log = logging.getLogger(__name__)

T = TypeVar("T")


class DeadLetterError(Exception):
    """A dead-letter operation could not be carried out; the message says why."""


class DeadLetterQueueMissing(DeadLetterError):
    """The dead-letter queue does not exist on the broker (the topology is not applied)."""


class DeadLetterBrokerError(DeadLetterError):
    """The broker refused an operation or the connection failed."""


# Pure parts: reading a dead letter, filtering, and the envelope a replay publishes.


@dataclass(frozen=True)
class DeadLetter:
    """One message in a dead-letter queue, as an operator wants to see it.

    `cause` is the consumer library's (rejected, max-attempts, delivery-limit, malformed,
    skipped) or, for a message the broker dead-lettered itself, its x-death reason
    (delivery-limit, expired, maxlen, rejected). `age_seconds` is how long ago it was
    dead-lettered.
    """

    message_id: str
    reason: str | None
    cause: str | None
    error_type: str | None
    attempts: int | None
    original_band: str | None
    priority: int | None
    failed_at: datetime | None
    enqueued_at: datetime | None
    age_seconds: float | None
    replays: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "message_id": self.message_id,
            "reason": self.reason,
            "cause": self.cause,
            "error_type": self.error_type,
            "attempts": self.attempts,
            "original_band": self.original_band,
            "priority": self.priority,
            "failed_at": _iso(self.failed_at),
            "enqueued_at": _iso(self.enqueued_at),
            "age_seconds": self.age_seconds,
            "replays": self.replays,
        }


def read_dead_letter(
    spec: QueueSpec,
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    priority: int | None,
    timestamp: datetime | None,
    now: datetime,
) -> DeadLetter:
    """The `DeadLetter` view of a DLQ message's properties and headers."""
    values: Mapping[str, Any] = headers or {}
    death = _last_death(values)
    reason = wire.header_text(values.get(FAILURE_REASON))
    cause = wire.header_text(values.get(FAILURE_CAUSE))
    band = wire.header_text(values.get(ORIGINAL_BAND))
    failed_at = _millis(values.get(FAILED_AT))
    if death is not None and cause is None:
        # Dead-lettered by the broker itself (a delivery limit, a TTL on a band without aging
        # above it, a length limit), not by a worker.
        death_reason, death_queue, death_time = death
        cause = death_reason.replace("_", "-")
        reason = f"dead-lettered by RabbitMQ from {death_queue or 'a queue'} ({death_reason})"
        if band is None and death_queue and death_queue.startswith(f"{spec.name}."):
            band = death_queue.removeprefix(f"{spec.name}.")
        failed_at = failed_at or death_time
    enqueued_at = _millis(values.get(wire.ENQUEUED_AT)) or _aware(timestamp)
    return DeadLetter(
        message_id=message_id or "",
        reason=reason,
        cause=cause,
        error_type=wire.header_text(values.get(FAILURE_TYPE)),
        attempts=wire.header_int(values.get(ATTEMPTS)) or wire.header_int(values.get(wire.ATTEMPT)),
        original_band=band,
        priority=priority,
        failed_at=failed_at,
        enqueued_at=enqueued_at,
        age_seconds=round((now - failed_at).total_seconds(), 3) if failed_at else None,
        replays=wire.header_int(values.get(REPLAYS)) or 0,
    )


def matches(record: DeadLetter, reason: str | None) -> bool:
    """True when `reason` is None or, case-insensitively, part of the cause, reason or type."""
    if not reason:
        return True
    wanted = reason.casefold()
    fields = (record.cause, record.reason, record.error_type)
    return any(wanted in value.casefold() for value in fields if value)


@dataclass(frozen=True)
class _Replayed(wire.Envelope):
    """An envelope that republishes the dead letter's body bytes as they are."""

    raw_body: bytes = b""

    def body(self) -> bytes:
        return self.raw_body


def replay_priority(spec: QueueSpec, record: DeadLetter) -> int:
    """The priority to republish with, so that the message lands in its original band.

    A message the broker promoted by aging was handled in a hotter band than its priority's;
    its priority is raised into that band, as a retry does. Without a known band, its own
    priority decides (the band's lowest when it has none).
    """
    band = None
    if record.original_band is not None:
        band = next((b for b in spec.bands if b.name == record.original_band), None)
    if record.priority is None:
        return band.low if band is not None else spec.bands[-1].low
    priority = min(MAX_PRIORITY, max(MIN_PRIORITY, record.priority))
    if band is None:
        return priority
    return min(band.high, max(band.low, priority))


def replay_envelope(
    spec: QueueSpec,
    record: DeadLetter,
    body: bytes,
    headers: Mapping[str, Any] | None,
    content_type: str | None,
) -> wire.Envelope | str:
    """The envelope a replay publishes, or why this message cannot be replayed.

    Same message id, body bytes, producer headers, partition key and enqueue time; attempt 1;
    the failure headers and the broker's death headers dropped (a copy that kept `x-death`
    could be dropped by the broker's dead-letter cycle detection); the replay counted.
    """
    if not _is_json(content_type):
        return (
            f"content type {content_type!r} is not {wire.CONTENT_TYPE}: replaying would "
            "relabel it; consume it from the dead-letter queue instead"
        )
    values: Mapping[str, Any] = headers or {}
    extra = carried_headers(values)
    extra[REPLAYS] = record.replays + 1
    return _Replayed(
        queue=spec.name,
        payload=None,
        priority=replay_priority(spec, record),
        message_id=record.message_id or wire.new_message_id(),
        enqueued_at=record.enqueued_at or wire.now(),
        partition_key=wire.header_text(values.get(wire.PARTITION_KEY)),
        attempt=1,
        extra_headers=extra,
        raw_body=body,
    )


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == wire.CONTENT_TYPE or media_type.endswith("+json")


def _last_death(headers: Mapping[str, Any]) -> tuple[str, str | None, datetime | None] | None:
    """(reason, queue, time) of the most recent broker dead-lettering, if any."""
    deaths = headers.get("x-death")
    if isinstance(deaths, list | tuple) and deaths and isinstance(deaths[0], Mapping):
        latest = deaths[0]  # the broker keeps the most recent first
        reason = wire.header_text(latest.get("reason"))
        if reason:
            when = latest.get("time")
            moment = _aware(when) if isinstance(when, datetime) else None
            return reason, wire.header_text(latest.get("queue")), moment
    reason = wire.header_text(headers.get("x-first-death-reason"))
    if reason:
        return reason, wire.header_text(headers.get("x-first-death-queue")), None
    return None


def _millis(value: object) -> datetime | None:
    number = wire.header_int(value)
    return wire.from_millis(number) if number is not None else None


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


# Broker operations.


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
    async with _channel(connection, dlq) as channel:
        return await _depth(channel, dlq)


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
    async with _channel(connection, dlq) as channel, _holding(channel, dlq) as take:
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
        async with _channel(connection, dlq) as channel, _holding(channel, dlq) as take:
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
                    await _settle(message.ack(), dlq)
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
    async with _channel(connection, dlq) as channel:
        target = await _settle(channel.get_queue(dlq, ensure=True), dlq)
        result = await _settle(target.purge(), dlq)
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


_BROKER_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError, TimeoutError)


async def _settle(awaitable: Awaitable[T], dlq: str) -> T:
    """Await a broker call, turning its failures into `DeadLetterError`s."""
    try:
        result = await awaitable
    except aiormq.exceptions.ChannelNotFoundEntity:
        raise DeadLetterQueueMissing(
            f"dead-letter queue {dlq!r} does not exist: run `bandgate topology apply`"
        ) from None
    except _BROKER_ERRORS as exc:
        raise DeadLetterBrokerError(
            f"broker error on {dlq!r}: {exc or type(exc).__name__}"
        ) from None
    return result


@contextlib.asynccontextmanager
async def _channel(connection: AbstractConnection, dlq: str) -> AsyncIterator[AbstractChannel]:
    channel: AbstractChannel = await _settle(connection.channel(publisher_confirms=False), dlq)
    try:
        yield channel
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()


async def _depth(channel: AbstractChannel, dlq: str) -> int:
    queue = await _settle(channel.get_queue(dlq, ensure=True), dlq)
    return int(queue.declaration_result.message_count or 0)


@dataclass
class _Taker:
    """Takes the messages a DLQ held when `start()` ran, with basic.get, and remembers the
    delivery tags of those not acked, in the order taken."""

    channel: AbstractChannel
    dlq: str
    total: int = 0
    taken: int = 0
    held: list[int] = field(default_factory=list)

    async def start(self) -> int:
        self.total = await _depth(self.channel, self.dlq)
        return self.total

    async def __call__(self) -> AbstractIncomingMessage | None:
        if self.taken >= self.total:
            return None
        queue = await _settle(self.channel.get_queue(self.dlq, ensure=False), self.dlq)
        message: AbstractIncomingMessage | None = await _settle(
            queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT_SECONDS), self.dlq
        )
        if message is not None and message.delivery_tag is not None:
            self.taken += 1
            self.held.append(message.delivery_tag)
        return message

    async def rest(self) -> None:
        """Take what is left too (bodies dropped): returning every message, in order, is
        what keeps the queue's order when part of it was already returned before."""
        while await self() is not None:
            pass

    def settled(self, message: AbstractIncomingMessage) -> None:
        """Forget a message that was acked."""
        tag = message.delivery_tag
        if self.held and self.held[-1] == tag:
            self.held.pop()
        elif tag in self.held:
            self.held.remove(tag)


@contextlib.asynccontextmanager
async def _holding(channel: AbstractChannel, dlq: str) -> AsyncIterator[_Taker]:
    """A `_Taker`; on the way out, every message it still holds is returned with
    basic.nack(requeue), one at a time in the order taken (should the channel be gone, the
    broker has returned them already)."""
    take = _Taker(channel, dlq)
    try:
        yield take
    finally:
        if take.held and not channel.is_closed:
            try:
                underlay = await channel.get_underlay_channel()
                for tag in take.held:
                    await underlay.basic_nack(tag, multiple=False, requeue=True)
            except Exception:  # the channel is gone: the broker returns them all by itself
                log.debug("returning %d dead letters with their channel", len(take.held))
        take.held.clear()


__all__ = [
    "REPLAYS",
    "DeadLetter",
    "DeadLetterBrokerError",
    "DeadLetterError",
    "DeadLetterQueueMissing",
    "ProgressCallback",
    "ReplayProgress",
    "ReplayResult",
    "count_dead_letters",
    "list_dead_letters",
    "matches",
    "purge",
    "read_dead_letter",
    "replay",
    "replay_envelope",
    "replay_priority",
]

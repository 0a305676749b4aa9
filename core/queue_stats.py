"""Queue statistics read from the broker.

Per band: ready and consumers over AMQP (passive declares, always current); unacked and the age
of the message at the head of the band from the management API when one is configured (its
figures are refreshed every few seconds). The head's age needs the broker to track it: classic
queues report `head_message_timestamp` (bandgate sets the AMQP timestamp on every message);
quorum queues on 3.x do not, and their age is null.

The management API lists a queue its statistics database has not sampled yet without any
counts: for 5 s after a classic queue is declared, up to 10 s for a quorum queue (its counts
reach the database on a Ra tick, then a collection interval), so right after `make run` or a
topology apply every band's unacked was null. Unacked is then read from the broker's own
counters (`ManagementClient.queue_counts`), which exist from the declaration on: a classic
queue's current, a quorum queue's as of its last Ra tick (every 5 s; 0 before the first), no
staler than the database's figures are later. AMQP cannot stand in: it tells no unacked
count, and "no consumers, so none unacked" is false (a `basic.get` without ack, as the DLQ
listing does, holds messages with no consumer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import aiormq
import httpx
from aio_pika.abc import AbstractChannel, AbstractConnection
from typing_extensions import TypedDict  # pydantic reads typing's on Python 3.12+ only

from bandgate.topology import naming, wire
from bandgate.topology.management import ManagementClient
from bandgate.topology.model import QueueSpec, Topology


class ShardStats(TypedDict):
    queue: str
    ready: int | None
    unacked: int | None
    consumers: int | None
    oldest_ready_age_seconds: float | None
    ready_by_priority: dict[str, int] | None


class BandStats(TypedDict):
    """A band's counts; for a sharded band the sums over its shards (the oldest head for the
    age), with each shard in `shards` (empty for a band of one queue)."""

    band: str
    queue: str  # the band's queue; for a sharded band the prefix of its shards' names
    priorities: list[int]
    ready: int | None
    unacked: int | None
    consumers: int | None
    oldest_ready_age_seconds: float | None
    # Ready messages per AMQP priority, where the broker counts them (quorum queues on 4.3,
    # from the management API); None elsewhere, and for ordered queues, whose messages all
    # carry one AMQP priority.
    ready_by_priority: dict[str, int] | None
    shards: list[ShardStats]


class QueueStats(TypedDict):
    queue: str
    bands: list[BandStats]
    ready: int
    delayed: int
    delayed_scope: str  # "deployment": the delay ladder is shared by every queue
    dead_lettered: int | None


class StatsError(Exception):
    """The broker could not be asked; `code` is the API error code to answer with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class BandDescription(TypedDict):
    name: str
    priorities: list[int]
    queue: str
    type: str
    age_after_seconds: float | None
    shards: list[str]  # a sharded band's queues; empty for a band of one queue


class QueueDescription(TypedDict):
    """A queue of the topology as `GET /v1/queues` lists it."""

    name: str
    bands: list[BandDescription]
    dead_letter_queue: str
    max_attempts: int


def describe_queue(spec: QueueSpec) -> QueueDescription:
    return {
        "name": spec.name,
        "bands": [
            {
                "name": band.name,
                "priorities": list(band.priorities),
                "queue": naming.band_queue(spec.name, band.name),
                "type": band.type,
                "age_after_seconds": band.age_after_seconds,
                "shards": list(spec.band_queues(band)) if band.shards > 1 else [],
            }
            for band in spec.bands
        ],
        "dead_letter_queue": naming.dead_letter_queue(spec.name),
        "max_attempts": spec.retry.max_attempts,
    }


async def collect_queue_stats(
    connection: AbstractConnection,
    topology: Topology,
    spec: QueueSpec,
    management: ManagementClient | None = None,
    now: datetime | None = None,
) -> QueueStats:
    """Counts for one logical queue; raises `StatsError` when the broker cannot answer.

    `delayed` counts the whole deployment's delay ladder, which all queues share.
    """
    details = await _management_view(
        management, [name for band in spec.bands for name in spec.band_queues(band)]
    )
    try:
        channel = await connection.channel(publisher_confirms=False)
    except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
        raise StatsError("broker_unavailable", f"cannot open a channel: {exc}") from None
    try:
        bands: list[BandStats] = []
        for band in spec.bands:
            shards: list[ShardStats] = []
            for name in spec.band_queues(band):
                ready, consumers = await _counts(channel, name)
                view = details.get(name) if details is not None else None
                shards.append(
                    ShardStats(
                        queue=name,
                        ready=ready,
                        unacked=_unacked(view) if details is not None else None,
                        consumers=consumers,
                        oldest_ready_age_seconds=head_age_seconds(view, ready, now or wire.now()),
                        ready_by_priority=None if spec.ordered else by_priority(view),
                    )
                )
            bands.append(
                BandStats(
                    band=band.name,
                    queue=naming.band_queue(spec.name, band.name),
                    priorities=list(band.priorities),
                    ready=_total(shard["ready"] for shard in shards),
                    unacked=_total(shard["unacked"] for shard in shards),
                    consumers=_total(shard["consumers"] for shard in shards),
                    oldest_ready_age_seconds=max(
                        (age for s in shards if (age := s["oldest_ready_age_seconds"]) is not None),
                        default=None,
                    ),
                    ready_by_priority=_sum_by_priority(s["ready_by_priority"] for s in shards),
                    shards=shards if band.shards > 1 else [],
                )
            )
        delayed = 0
        for level in range(topology.ladder.levels):
            waiting, _ = await _counts(channel, naming.delay_level(topology.exchange, level))
            delayed += waiting
        dead, _ = await _counts(channel, naming.dead_letter_queue(spec.name))
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise StatsError("topology_missing", f"topology missing on the broker: {exc}") from None
    except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
        raise StatsError("broker_unavailable", f"broker error: {exc}") from None
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()
    return QueueStats(
        queue=spec.name,
        bands=bands,
        ready=sum(band["ready"] or 0 for band in bands),
        delayed=delayed,
        delayed_scope="deployment",
        dead_lettered=dead,
    )


def head_age_seconds(
    view: Mapping[str, Any] | None, ready: int | None, now: datetime
) -> float | None:
    """Age of the message at the head of a queue, from the management API's view of it.

    None when the queue is empty or the broker does not track it (`head_message_timestamp`
    is seconds since the epoch, the AMQP timestamp of the head message).
    """
    if view is None or not ready:
        return None
    stamp = view.get("head_message_timestamp")
    if not isinstance(stamp, int | float) or isinstance(stamp, bool):
        return None
    return max(0.0, round(now.timestamp() - float(stamp), 3))


def by_priority(view: Mapping[str, Any] | None) -> dict[str, int] | None:
    """Ready messages per priority from the management API's view of a queue, highest first.

    RabbitMQ 4.3 reports `messages_by_priority` for quorum queues (priorities with none left
    out); other versions and queue types do not, and get None.
    """
    counts = view.get("messages_by_priority") if view is not None else None
    if not isinstance(counts, dict):
        return None
    found = {
        str(key): value
        for key, value in counts.items()
        if str(key).isdigit() and isinstance(value, int) and value
    }
    return dict(sorted(found.items(), key=lambda item: -int(item[0])))


def _sum_by_priority(shards: Iterable[dict[str, int] | None]) -> dict[str, int] | None:
    """A sharded band's counts per priority; None when any shard's are unknown."""
    total: dict[str, int] = {}
    for counts in shards:
        if counts is None:
            return None
        for priority, count in counts.items():
            total[priority] = total.get(priority, 0) + count
    return dict(sorted(total.items(), key=lambda item: -int(item[0])))


async def _counts(channel: AbstractChannel, name: str) -> tuple[int, int]:
    queue = await channel.get_queue(name, ensure=True)
    result = queue.declaration_result
    return int(result.message_count or 0), int(result.consumer_count or 0)


def _total(counts: Iterable[int | None]) -> int | None:
    """The sum, or None when any count is unknown."""
    total = 0
    for count in counts:
        if count is None:
            return None
        total += count
    return total


def _unacked(view: Mapping[str, Any] | None) -> int | None:
    if view is None:
        return None
    value = view.get("messages_unacknowledged")
    return int(value) if isinstance(value, int) else None


_UNACKED = "messages_unacknowledged"


async def _management_view(
    management: ManagementClient | None, needed: Iterable[str]
) -> dict[str, dict[str, Any]] | None:
    """The management API's view of every queue in the vhost, by name; None without one.
    A `needed` queue the statistics database has not sampled yet gets its unacked count from
    the broker's counters (module docstring)."""
    if management is None:
        return None
    try:
        views = _by_name(await management.queues())
    except (httpx.HTTPError, ValueError):
        return None
    unsampled = [name for name in needed if _UNACKED not in views.get(name, {})]
    if not unsampled:
        return views
    try:
        counts = _by_name(await management.queue_counts())
    except (httpx.HTTPError, ValueError):
        return views
    for name in unsampled:
        unacked = counts.get(name, {}).get(_UNACKED)
        if unacked is not None:
            views[name] = {**views.get(name, {"name": name}), _UNACKED: unacked}
    return views


def _by_name(queues: Iterable[Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in queues if isinstance(item, dict) and "name" in item}


__all__ = [
    "BandDescription",
    "BandStats",
    "QueueDescription",
    "QueueStats",
    "ShardStats",
    "StatsError",
    "collect_queue_stats",
    "describe_queue",
    "by_priority",
    "head_age_seconds",
]

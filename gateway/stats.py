"""Queue statistics read from the broker: per band ready and consumers over AMQP (passive
declares), unacked from the management API when one is configured."""

from __future__ import annotations

import contextlib
from typing import Any

import aiormq
import httpx

from gateway.broker import BrokerLink
from gateway.errors import ApiError
from topology import naming
from topology.model import QueueSpec, Topology


def describe_queue(spec: QueueSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "bands": [
            {
                "name": band.name,
                "priorities": list(band.priorities),
                "queue": naming.band_queue(spec.name, band.name),
                "type": band.type,
                "age_after_seconds": band.age_after_seconds,
            }
            for band in spec.bands
        ],
        "dead_letter_queue": naming.dead_letter_queue(spec.name),
        "max_attempts": spec.retry.max_attempts,
    }


async def queue_stats(link: BrokerLink, topology: Topology, spec: QueueSpec) -> dict[str, Any]:
    """Counts for one logical queue. `delayed` is the whole deployment's delay ladder, which
    all queues share; `unacked` is null without a management URL."""
    if link.connection is None or not link.connected:
        raise ApiError(503, "broker_unavailable", link.problem or "not connected to the broker")
    unacked = await _unacked_by_queue(link)
    try:
        channel = await link.connection.channel(publisher_confirms=False)
    except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
        raise ApiError(503, "broker_unavailable", f"cannot open a channel: {exc}") from None
    try:
        bands = []
        for band in spec.bands:
            name = naming.band_queue(spec.name, band.name)
            queue = await channel.get_queue(name, ensure=True)
            result = queue.declaration_result
            bands.append(
                {
                    "band": band.name,
                    "queue": name,
                    "priorities": list(band.priorities),
                    "ready": result.message_count,
                    "unacked": unacked.get(name) if unacked is not None else None,
                    "consumers": result.consumer_count,
                }
            )
        delayed = 0
        for level in range(topology.ladder.levels):
            queue = await channel.get_queue(naming.delay_level(topology.exchange, level))
            delayed += queue.declaration_result.message_count or 0
        dlq = await channel.get_queue(naming.dead_letter_queue(spec.name))
        dead = dlq.declaration_result.message_count
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        raise ApiError(503, "topology_missing", f"topology missing on the broker: {exc}") from None
    except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
        raise ApiError(503, "broker_unavailable", f"broker error: {exc}") from None
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()
    return {
        "queue": spec.name,
        "bands": bands,
        "ready": sum(band["ready"] or 0 for band in bands),
        "delayed": delayed,
        "delayed_scope": "deployment",
        "dead_lettered": dead,
    }


async def _unacked_by_queue(link: BrokerLink) -> dict[str, int] | None:
    if link.management is None:
        return None
    try:
        queues = await link.management.queues()
    except (httpx.HTTPError, ValueError):
        return None
    return {item["name"]: int(item.get("messages_unacknowledged", 0)) for item in queues}

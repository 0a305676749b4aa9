"""What the ledger benchmark (`bench.ledger`) sets up on the broker: an empty tombstone ledger,
many entries written to it, a backlog of messages with known ids, and the stream's size on disk.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from itertools import islice
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.ledger import Entry
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import load_topology
from bench.environment import BenchBroker
from bench.raw_amqp import fill

WRITE_CHUNK = 1_000  # ledger records in flight at once


@asynccontextmanager
async def ledger_publisher(
    broker: BenchBroker,
) -> AsyncIterator[tuple[AbstractRobustConnection, Publisher]]:
    """A fresh connection and a publisher on it, as a worker or the gateway has them."""
    connection = await aio_pika.connect_robust(broker.amqp_url)
    async with connection:
        publisher = Publisher(load_topology(), ChannelSet(confirm_channel_factory(connection)))
        try:
            await publisher.channels.get()  # open before anything is timed
            yield connection, publisher
        finally:
            await publisher.channels.close()


async def reset_ledger(broker: BenchBroker) -> None:
    """An empty ledger: its stream deleted and declared again with the topology."""
    topology = load_topology()
    connection = await aio_pika.connect(broker.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(naming.ledger_stream(topology.exchange))
        await apply_topology(connection, topology)


async def write_entries(broker: BenchBroker, entries: Iterable[Entry]) -> tuple[int, float]:
    """Record `entries`, `WRITE_CHUNK` confirmed records in flight at once: (count, seconds)."""
    async with ledger_publisher(broker) as (_, publisher):
        written, started = 0, time.perf_counter()
        for chunk in _chunks(entries, WRITE_CHUNK):
            await asyncio.gather(*(publisher.record(entry.encode()) for entry in chunk))
            written += len(chunk)
        return written, time.perf_counter() - started


def _chunks(entries: Iterable[Entry], size: int) -> Iterator[list[Entry]]:
    iterator = iter(entries)
    while chunk := list(islice(iterator, size)):
        yield chunk


async def band_backlog(broker: BenchBroker, queue: str) -> int:
    """Messages ready in `queue`'s bands."""
    connection = await aio_pika.connect(broker.amqp_url)
    async with connection:
        channel = await connection.channel()
        ready = 0
        for band in load_topology().queue(queue).bands:
            name = naming.band_queue(queue, band.name)
            declared = await channel.declare_queue(name, passive=True)
            ready += declared.declaration_result.message_count or 0
    return ready


def fill_ids(url: str, routing_key: str, message: aio_pika.Message, ids: list[bytes]) -> None:
    """Publish a copy of `message` per id in `ids` (mandatory, confirmed), in that order."""
    fill(url, load_topology().exchange, routing_key, message, len(ids), ids)


def stream_disk_bytes(broker: BenchBroker) -> int | None:
    """The ledger stream's files on the private node's disk (None: not found, or not our node).

    The node's data directory is in its environment (`RABBITMQ_MNESIA_BASE`); a stream keeps
    its segments in a directory of `stream/` named after it (its dots made underscores), the
    newest such being the live one."""
    if broker.pid is None:
        return None
    try:
        environ = Path(f"/proc/{broker.pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    bases = [
        item.split(b"=", 1)[1] for item in environ if item.startswith(b"RABBITMQ_MNESIA_BASE=")
    ]
    if not bases:
        return None
    name = re.sub(r"[^A-Za-z0-9]", "_", naming.ledger_stream(load_topology().exchange))
    found = [path for path in Path(bases[0].decode()).glob(f"*/stream/*{name}*") if path.is_dir()]
    if not found:
        return None
    newest = max(found, key=lambda path: path.stat().st_mtime)
    return sum(path.stat().st_size for path in newest.rglob("*") if path.is_file())

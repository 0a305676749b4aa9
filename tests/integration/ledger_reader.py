"""What the tombstone ledger holds, read back raw from its stream for tests.

The stream keeps write order, so reading until a known entry turns up yields everything written
before it too: a test that wants to show nothing else was written writes a sentinel last and
compares the whole list.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from bandgate.core.ledger import Entry, decode
from bandgate.topology import naming
from bandgate.topology.model import Topology

# (op, queue, message_id, generation): an entry without its write time, which no test knows.
Written = tuple[str, str, str, int]
WAIT_SECONDS = 10.0


def written(entry: Entry) -> Written:
    return (entry.op, entry.queue, entry.message_id, entry.generation)


async def entries_until(
    connection: AbstractConnection,
    topology: Topology,
    last: Callable[[Entry], bool],
) -> list[Written]:
    """Every entry from the stream's start to the first that `last` accepts, marks left out;
    TimeoutError when none turns up in `WAIT_SECONDS`."""
    found: list[Written] = []
    done = asyncio.Event()

    async def on_message(message: AbstractIncomingMessage) -> None:
        entry = decode(message.body)
        if not done.is_set() and entry.op != "mark":
            found.append(written(entry))
            if last(entry):
                done.set()
        await message.ack()

    channel = await connection.channel()
    try:
        await channel.set_qos(prefetch_count=100)  # a stream consumer needs one
        stream = await channel.declare_queue(naming.ledger_stream(topology.exchange), passive=True)
        await stream.consume(on_message, arguments={"x-stream-offset": "first"})
        await asyncio.wait_for(done.wait(), WAIT_SECONDS)
    finally:
        await channel.close()
    return found


async def entries_through(
    connection: AbstractConnection, topology: Topology, op: str, message_id: str
) -> list[Written]:
    """Every entry up to the first `op` entry of `message_id`."""
    return await entries_until(
        connection, topology, lambda e: (e.op, e.message_id) == (op, message_id)
    )

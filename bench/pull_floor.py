"""The floor under the HTTP receivers' drain (issue 35): what uvicorn and one AMQP consumer cost
with none of the receivers' own machinery.

An ASGI app, run by plain uvicorn (httptools, uvloop) as `bench pull` runs the gateway, that
consumes the one band of `bench pull`'s one-band drain on one aiormq channel, with the
prefetch the drain's gateway has (`PREFETCH`), and serves the drain's two requests: `receive`
(settle the `ack` receipts, then wait up to `wait_seconds` for a message and answer up to
`max_messages`) and the batch ack. A receipt is the delivery tag; a message answers with its id,
receipt, payload and priority. No auth, schema, leases, visibility timeouts, waterfall, retry or
dead-letter decision, metrics or head limits: those are what the receivers add above it.

Not a server to deploy: a message whose client never acks stays unacked until it disconnects.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any

import aiormq
import orjson
from aiormq.abc import DeliveredMessage
from starlette.types import Scope

from bandgate.topology import naming
from bandgate.topology.loader import load_topology
from bench.bare_asgi import floor_app

QUEUE = "orders"
PRIORITY = 8  # the one-band drain's messages
PREFETCH = 170  # the drain's gateway: 128 MiB of prefetch over 3 bands of 256 KiB bodies

_band = load_topology().queue(QUEUE).band_for(PRIORITY)
_queue_name = naming.band_queue(QUEUE, _band.name)


class Consumer:
    """One channel's deliveries, waiting to be received."""

    def __init__(self) -> None:
        self.ready: deque[DeliveredMessage] = deque()
        self.arrived = asyncio.Event()
        self.channel: Any = None

    async def start(self, url: str) -> None:
        self.connection = await aiormq.connect(url)
        self.channel = await self.connection.channel()
        await self.channel.basic_qos(prefetch_count=PREFETCH)
        await self.channel.basic_consume(_queue_name, self._deliver)

    async def _deliver(self, message: DeliveredMessage) -> None:
        self.ready.append(message)
        self.arrived.set()

    async def take(self, most: int, wait: float) -> list[DeliveredMessage]:
        if not self.ready:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), wait)
            except TimeoutError:
                return []
        return [self.ready.popleft() for _ in range(min(most, len(self.ready)))]

    async def ack(self, receipts: list[str]) -> dict[str, Any]:
        for receipt in receipts:
            await self.channel.basic_ack(int(receipt), wait=False)
        return {"successful": [{"receipt": receipt} for receipt in receipts], "failed": []}


_consumer = Consumer()


async def _serve(scope: Scope, data: Any) -> tuple[int, bytes]:
    if scope["path"].endswith("/ack"):
        return 200, orjson.dumps(await _consumer.ack(data["receipts"]))
    reply: dict[str, Any] = {}
    if "ack" in data:
        reply["ack"] = await _consumer.ack(data["ack"])
    taken = await _consumer.take(data["max_messages"], data["wait_seconds"])
    reply["messages"] = [_message(delivered) for delivered in taken]
    return 200, orjson.dumps(reply)


def _message(delivered: DeliveredMessage) -> dict[str, Any]:
    properties = delivered.header.properties
    return {
        "message_id": properties.message_id,
        "receipt": str(delivered.delivery_tag),
        "payload": orjson.loads(delivered.body),
        "priority": properties.priority,
    }


async def _start() -> None:
    await _consumer.start(os.environ["BANDGATE_AMQP_URL"])


async def _stop() -> None:
    await _consumer.connection.close()


app = floor_app(_serve, _start, _stop)

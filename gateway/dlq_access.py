"""Reading a dead-letter queue on the broker without losing a message or its order, and the
errors the dead-letter tools raise.

RabbitMQ has no peek. A `Taker` takes every message the DLQ holds with `basic.get`, keeps them
unacked, then `holding` returns them all with `basic.nack(requeue=True)`, one at a time in the
order read: nothing is lost, and the order is kept whichever way the broker requeues (quorum
queues on 3.x, and on 4.x where a delivery limit always applies, put returned messages ahead of
the rest, behind those returned before; 3.13 without a delivery limit puts them at the back).
Reading all of it, not only what is wanted, is what keeps the order when part of the queue was
returned before. On 4.0-4.2 every return counts towards the delivery limit (default 20), and a
DLQ without a dead-letter exchange drops a message that reaches it; 4.3 stopped counting
`basic.nack`. `bandgate doctor` warns about it. A taker reads at most what the DLQ held when
it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

GET_TIMEOUT_SECONDS = 10.0
RETURN_CHECKS = 100
RETURN_CHECK_INTERVAL = 0.02

log = logging.getLogger(__name__)

T = TypeVar("T")


class DeadLetterError(Exception):
    """A dead-letter operation could not be carried out; the message says why."""


class DeadLetterQueueMissing(DeadLetterError):
    """The dead-letter queue does not exist on the broker (the topology is not applied)."""


class DeadLetterBrokerError(DeadLetterError):
    """The broker refused an operation or the connection failed."""


_BROKER_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError, TimeoutError)


async def settle(awaitable: Awaitable[T], dlq: str) -> T:
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
async def dlq_channel(connection: AbstractConnection, dlq: str) -> AsyncIterator[AbstractChannel]:
    channel: AbstractChannel = await settle(connection.channel(publisher_confirms=False), dlq)
    try:
        yield channel
    finally:
        if not channel.is_closed:
            with contextlib.suppress(Exception):
                await channel.close()


async def depth(channel: AbstractChannel, dlq: str) -> int:
    queue = await settle(channel.get_queue(dlq, ensure=True), dlq)
    return int(queue.declaration_result.message_count or 0)


@dataclass
class Taker:
    """Takes the messages a DLQ held when `start()` ran, with basic.get, and remembers the
    delivery tags of those not acked, in the order taken."""

    channel: AbstractChannel
    dlq: str
    total: int = 0
    taken: int = 0
    held: list[int] = field(default_factory=list)

    async def start(self) -> int:
        self.total = await depth(self.channel, self.dlq)
        return self.total

    async def __call__(self) -> AbstractIncomingMessage | None:
        if self.taken >= self.total:
            return None
        queue = await settle(self.channel.get_queue(self.dlq, ensure=False), self.dlq)
        message: AbstractIncomingMessage | None = await settle(
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
async def holding(channel: AbstractChannel, dlq: str) -> AsyncIterator[Taker]:
    """A `Taker`; on the way out, every message it still holds is returned with
    basic.nack(requeue), one at a time in the order taken (should the channel be gone, the
    broker has returned them already)."""
    take = Taker(channel, dlq)
    try:
        yield take
    finally:
        if take.held and not channel.is_closed:
            try:
                waiting = await depth(channel, dlq)
                underlay = await channel.get_underlay_channel()
                for tag in take.held:
                    await underlay.basic_nack(tag, multiple=False, requeue=True)
                await _back_in_queue(channel, dlq, waiting + len(take.held))
            except Exception:  # the channel is gone: the broker returns them all by itself
                log.debug("returning %d dead letters with their channel", len(take.held))
        take.held.clear()


async def _back_in_queue(channel: AbstractChannel, dlq: str, expected: int) -> None:
    """Wait (briefly) until the DLQ counts the returned messages again.

    A quorum queue applies a return a moment after the nack is sent; without this, a listing
    run right after another one could find part of the queue still out.
    """
    for _ in range(RETURN_CHECKS):
        if await depth(channel, dlq) >= expected:
            return
        await asyncio.sleep(RETURN_CHECK_INTERVAL)
    log.warning("returned dead letters of %s are not all counted in the queue yet", dlq)


__all__ = [
    "GET_TIMEOUT_SECONDS",
    "DeadLetterBrokerError",
    "DeadLetterError",
    "DeadLetterQueueMissing",
    "Taker",
    "depth",
    "dlq_channel",
    "holding",
    "settle",
]

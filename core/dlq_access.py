"""Reading a dead-letter queue on the broker without losing a message or its order, the lock
that lets one dead-letter operation at a time touch it, and the errors the tools raise.

RabbitMQ has no peek. A `Taker` takes every message the DLQ holds with `basic.get` and keeps
them unacked; `holding` then returns them with `basic.nack(requeue)` in the order read. Quorum
queues put returned messages ahead of the rest, behind those returned before, so reading all of
it (what it held at the start), not only what is wanted, is what keeps the order. Measured on
RabbitMQ 3.10.8 (quorum):
- A return command carrying more than 32 messages comes back partly reversed or shuffled: a
  `multiple` nack, `basic.recover`, and also single nacks sent back to back, which the channel
  stashes and sends together once 32 are in flight. So the messages go back 32 at a time, each
  batch only once the queue counts the one before (a few ms); a listing of 3,000 came back in
  order every time this way. What a closed channel or connection leaves behind comes back
  ahead of the rest but shuffled (already at 30 messages): cancelled work gives back first.
- The count comes from a fresh `queue.declare(passive)` on the raw channel: aio-pika's robust
  channel answers a passive declare of a queue it declared before from its cache, and waiting on
  that stale count cost every listing 2 s.
Replay acks each message after its own publish confirm, so at most a couple of acks are ever
in flight and none waits in that stash when the channel closes (stashed ones would be lost).

On 4.0-4.2 every return counts towards the delivery limit (default 20), and a DLQ without a
dead-letter exchange drops a message that reaches it; 4.3 stopped counting `basic.nack`.
`bandgate doctor` warns about it.

The lock (`dlq_lock`) is an auto-delete classic queue (`naming.dead_letter_lock`) holding one
exclusive consumer: a second `basic.consume(exclusive)` is refused (ACCESS_REFUSED, from the
same connection too), and the broker deletes the queue when the consumer goes, also when its
connection dies. A refused attempt is retried on a fresh channel until a deadline, then
`DeadLetterBusy`. List, replay and purge release it only after their returns are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

import aiormq
from aio_pika import Channel
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

GET_TIMEOUT_SECONDS = 10.0
RETURN_BATCH = 32
RETURN_TIMEOUT_SECONDS = 10.0
LOCK_WAIT_SECONDS = 10.0
MAX_LOCK_WAIT = 600.0
LOCK_RETRY_SECONDS = (0.02, 0.25)  # first and longest pause between attempts
LOCK_EXPIRES_MS = 60_000  # a lock queue declared by a process that died before consuming it

log = logging.getLogger(__name__)

T = TypeVar("T")


class DeadLetterError(Exception):
    """A dead-letter operation could not be carried out; the message says why."""


class DeadLetterQueueMissing(DeadLetterError):
    """The dead-letter queue does not exist on the broker (the topology is not applied)."""


class DeadLetterBrokerError(DeadLetterError):
    """The broker refused an operation or the connection failed."""


class DeadLetterBusy(DeadLetterError):
    """Another list, replay or purge of the same dead-letter queue kept it past the wait."""


_BROKER_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError, TimeoutError)
_LOCK_TAKEN = (
    aiormq.exceptions.ChannelAccessRefused,  # another exclusive consumer holds it
    aiormq.exceptions.ChannelNotFoundEntity,  # released (auto-deleted) between declare and consume
    aiormq.exceptions.ChannelLockedResource,
)


async def broker_call(awaitable: Awaitable[T], dlq: str) -> T:
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


async def _open(connection: AbstractConnection) -> AbstractChannel:
    # A plain channel even on a robust connection: a robust one reopens itself after every
    # refused lock attempt, and would come back after a reconnect with new delivery tags.
    channel = Channel(connection, publisher_confirms=False)
    await channel
    return channel


async def _close(channel: AbstractChannel) -> None:
    if not channel.is_closed:
        with contextlib.suppress(Exception):
            await channel.close()


@contextlib.asynccontextmanager
async def dlq_channel(connection: AbstractConnection, dlq: str) -> AsyncIterator[AbstractChannel]:
    channel = await broker_call(_open(connection), dlq)
    try:
        yield channel
    finally:
        await _close(channel)


async def depth(channel: AbstractChannel, dlq: str) -> int:
    """Ready messages in `dlq` now (a fresh passive declare, never aio-pika's cached one)."""
    underlay = await broker_call(channel.get_underlay_channel(), dlq)
    declared = await broker_call(underlay.queue_declare(dlq, passive=True), dlq)
    return int(declared.message_count or 0)


@contextlib.asynccontextmanager
async def dlq_lock(
    connection: AbstractConnection, lock: str, dlq: str, wait: float = LOCK_WAIT_SECONDS
) -> AsyncIterator[None]:
    """Hold the lock queue `lock` of `dlq`, waiting up to `wait` s for whoever holds it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    pause = LOCK_RETRY_SECONDS[0]
    while (held := await _try_lock(connection, lock, dlq)) is None:
        if loop.time() + pause > deadline:
            raise DeadLetterBusy(
                f"{dlq} is busy: another list, replay or purge of it is running "
                f"(waited {wait:g} s); try again later"
            )
        await asyncio.sleep(pause)
        pause = min(pause * 2, LOCK_RETRY_SECONDS[1])
    channel, queue, tag = held
    try:
        yield
    finally:
        # Cancel first: cancel-ok comes once the queue dropped the consumer (and deleted
        # itself), so the next holder does not find it still taken.
        with contextlib.suppress(Exception):
            await queue.cancel(tag)
        await _close(channel)


async def _try_lock(
    connection: AbstractConnection, lock: str, dlq: str
) -> tuple[AbstractChannel, AbstractQueue, str] | None:
    channel = await broker_call(_open(connection), dlq)
    try:
        queue = await channel.declare_queue(
            lock, durable=False, auto_delete=True, arguments={"x-expires": LOCK_EXPIRES_MS}
        )
        tag = await queue.consume(_ignore, no_ack=True, exclusive=True)
    except _LOCK_TAKEN:
        await _close(channel)
        return None
    except BaseException as exc:
        await _close(channel)
        if isinstance(exc, _BROKER_ERRORS):
            raise DeadLetterBrokerError(f"cannot lock {dlq!r}: {exc}") from None
        raise
    return channel, queue, tag


async def _ignore(message: AbstractIncomingMessage) -> None:
    """Nothing is published to a lock queue; anything that is gets dropped (no_ack)."""


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
        queue = await broker_call(self.channel.get_queue(self.dlq, ensure=False), self.dlq)
        fetch = asyncio.ensure_future(
            broker_call(queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT_SECONDS), self.dlq)
        )
        try:
            message: AbstractIncomingMessage | None = await asyncio.shield(fetch)
        except asyncio.CancelledError:
            # The get is on the wire: record what it brings, or that message would only come
            # back with the channel, out of its place.
            with contextlib.suppress(Exception):
                self._hold(await fetch)
            raise
        self._hold(message)
        return message

    def _hold(self, message: AbstractIncomingMessage | None) -> None:
        if message is not None and message.delivery_tag is not None:
            self.taken += 1
            self.held.append(message.delivery_tag)

    async def rest(self) -> None:
        """Take what is left too (bodies dropped): returning every message, in order, is
        what keeps the queue's order when part of it was already returned before."""
        while await self() is not None:
            pass

    def settled(self, message: AbstractIncomingMessage) -> None:
        """Forget a message about to be acked."""
        tag = message.delivery_tag
        if self.held and self.held[-1] == tag:
            self.held.pop()
        elif tag in self.held:
            self.held.remove(tag)


@contextlib.asynccontextmanager
async def holding(channel: AbstractChannel, dlq: str) -> AsyncIterator[Taker]:
    """A `Taker`; on the way out (also when cancelled) it takes the rest of what the DLQ held
    and returns every message it still holds, in the order taken, before the caller may let
    the lock go. Should the channel be gone, the broker has returned them already, in an
    order of its own."""
    take = Taker(channel, dlq)
    try:
        yield take
    finally:
        if take.total:
            giving_back = asyncio.ensure_future(_give_back(take))
            try:
                await asyncio.shield(giving_back)
            except asyncio.CancelledError:
                await giving_back  # cancelled again while giving back: finish first
                raise


async def _give_back(take: Taker) -> None:
    if take.channel.is_closed:
        if take.held:
            log.warning(
                "%d dead letters of %s went back with their channel", len(take.held), take.dlq
            )
        return
    try:
        await take.rest()
        await return_in_order(take.channel, take.dlq, take.held)
    except DeadLetterError as exc:
        log.warning(
            "returning dead letters of %s failed (%s): the channel returns them", take.dlq, exc
        )
    take.held.clear()


async def return_in_order(channel: AbstractChannel, dlq: str, tags: list[int]) -> None:
    """Nack `tags` back to `dlq`, RETURN_BATCH at a time, each batch once the one before is
    counted (see the module docstring); at most RETURN_TIMEOUT_SECONDS of waiting."""
    if not tags:
        return
    underlay = await broker_call(channel.get_underlay_channel(), dlq)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RETURN_TIMEOUT_SECONDS
    expected = await depth(channel, dlq)
    waiting = True
    for start in range(0, len(tags), RETURN_BATCH):
        batch = tags[start : start + RETURN_BATCH]
        for tag in batch:
            await broker_call(underlay.basic_nack(tag, multiple=False, requeue=True), dlq)
        expected += len(batch)
        if waiting and not await _counted(channel, dlq, expected, deadline):
            # Someone else consumes the DLQ, or the broker is overloaded.
            log.warning(
                "returned dead letters of %s not counted within %.0f s: the rest go back "
                "without waiting, their order is not guaranteed",
                dlq,
                RETURN_TIMEOUT_SECONDS,
            )
            waiting = False


async def _counted(channel: AbstractChannel, dlq: str, expected: int, deadline: float) -> bool:
    """Poll until `dlq` counts `expected` ready messages (the broker sends no event for it),
    until the loop time `deadline`."""
    loop = asyncio.get_running_loop()
    pause = 0.001
    while await depth(channel, dlq) < expected:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return False
        await asyncio.sleep(min(pause, remaining))
        pause = min(pause * 2, 0.05)
    return True


__all__ = [
    "GET_TIMEOUT_SECONDS",
    "LOCK_WAIT_SECONDS",
    "MAX_LOCK_WAIT",
    "DeadLetterBrokerError",
    "DeadLetterBusy",
    "DeadLetterError",
    "DeadLetterQueueMissing",
    "Taker",
    "depth",
    "dlq_channel",
    "dlq_lock",
    "holding",
    "return_in_order",
    "broker_call",
]

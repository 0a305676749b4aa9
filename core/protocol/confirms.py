"""Confirmed publishing on one aiormq channel, with everything published in one event-loop
turn sent as one socket write.

aiormq's `basic_publish` costs a lock, a timeout, a queue put and a socket write per
message, which is most of the gateway's CPU per message. Here a publish only marshals its
frames and returns the future of its confirm; a flush task, started once per loop turn,
takes the channel's lock, numbers the waiting messages (delivery tags are implicit: the
broker counts publishes in the order it reads them) and hands their frames to the
connection's writer as one payload.

The pipeline answers its own confirms. aiormq makes each confirm future through its future
stores (the channel's and the connection's: three done callbacks per future) and answers a
multiple ack by scanning every pending confirm and scheduling a callback per tag; together
with the callback that forgot each message id, that was a fifth of the publishing core's
CPU per message in a batch (py-spy, 2026-11-27). Here a confirm is a plain future, kept in
publish order, and one ack frame settles its messages in one pass; the channel's close fails
those still waiting with the close reason, as aiormq's store would.

It still writes aiormq's own bookkeeping (`confirmations`, `message_id_delivery_tag`), so that
aiormq matches a return (`PublishError`) to its publish, and a plain aiormq publish on the same
channel still gets its confirm from aiormq. These are aiormq internals; `core.protocol.compat`
holds aiormq to the releases this was tested with (pyproject pins the same), and the
publisher's integration tests cover every outcome against the real library.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from aiormq.abc import ChannelFrame
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody

from bandgate.core.protocol import compat
from bandgate.core.protocol.content_header import content_header_frame

compat.check_amqp()  # this module writes aiormq's confirm bookkeeping

log = logging.getLogger(__name__)

Confirmation = asyncio.Future[Any]
ConfirmFrame = aiormq.spec.Basic.Ack | aiormq.spec.Basic.Nack
ChannelFactory = Callable[[], Awaitable[AbstractChannel]]

_METHOD_CACHE_LIMIT = 4096


class NotSent(ConnectionError):
    """The message never left the gateway (the channel closed first): it is not enqueued.

    A message that was written and then lost its confirm with the channel fails with aiormq's
    own close reason instead: its outcome is unknown."""


class FrameTooLarge(ValueError):
    """The message's properties do not fit in one AMQP frame of this connection.

    The broker answers such a frame by closing the whole connection (FRAME_ERROR), with
    every other publish on it, so it is refused here, before anything is written."""


class ConfirmPipeline:
    """Publishes mandatory, persistent-as-given messages on one confirm-mode channel."""

    def __init__(self, channel: aiormq.Channel) -> None:
        if not channel.publisher_confirms:
            raise ValueError("a confirm pipeline needs a channel in confirm mode")
        self.channel = channel
        self._waiting: list[tuple[bytes, str, Confirmation]] = []
        self._flush: asyncio.Task[None] | None = None
        self._method_frames: dict[tuple[str, str], bytes] = {}
        # Sent and not yet confirmed, in delivery tag order: tag -> (message_id, confirm).
        self._unconfirmed: OrderedDict[int, tuple[str, Confirmation]] = OrderedDict()
        self._aiormq_confirms = compat.take_confirms(channel, self._on_confirm)
        channel.closing.add_done_callback(self._on_close)

    @property
    def is_closed(self) -> bool:
        return self.channel.is_closed

    @property
    def filling(self) -> bool:
        """Messages wait for this loop turn's write."""
        return bool(self._waiting)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: aiormq.spec.Basic.Properties,
    ) -> Confirmation:
        """Queue one mandatory publish; the future resolves with the broker's answer.

        `properties.message_id` must be set: aiormq matches a returned message to its publish
        by it. Cancelling the future before its flush withdraws the message. Raises
        `FrameTooLarge` (nothing queued) when the properties exceed the connection's frame.
        """
        message_id = properties.message_id
        if not message_id:
            raise ValueError("a pipelined publish needs a message_id")
        number = self.channel.number
        size = self.channel.max_content_size
        header = content_header_frame(number, len(body), properties)
        if len(header) > size + self.channel.CONTENT_FRAME_SIZE:
            raise FrameTooLarge(
                f"the message's headers and properties take {len(header)} bytes; "
                f"the broker's frame limit is {size + self.channel.CONTENT_FRAME_SIZE}"
            )
        if self.channel.is_closed:
            return _not_sent(self.channel)
        confirmation: Confirmation = asyncio.get_running_loop().create_future()
        parts = [self._method_frame(exchange, routing_key), header]
        for start in range(0, len(body), size):
            parts.append(amqp_frame.marshal(ContentBody(body[start : start + size]), number))
        self._waiting.append((b"".join(parts), message_id, confirmation))
        if self._flush is None:
            self._flush = asyncio.get_running_loop().create_task(self._flush_waiting())
        return confirmation

    async def _flush_waiting(self) -> None:
        try:
            async with self.channel.lock:
                while self._waiting:
                    batch, self._waiting = self._waiting, []
                    await self._send(batch)
        except BaseException as exc:
            batch, self._waiting = self._waiting, []
            _fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._flush = None

    async def _send(self, batch: list[tuple[bytes, str, Confirmation]]) -> None:
        """Number the batch's messages and write them; holds the channel's lock."""
        channel = self.channel
        if channel.is_closed:
            # Writing now would put frames on a channel the broker closed: a connection error.
            error = NotSent(f"the channel closed before the message was sent: {channel!r}")
            _fail(batch, error)
            raise error
        first_tag = channel.delivery_tag
        payload = bytearray()
        numbered: list[int] = []
        unconfirmed = self._unconfirmed
        for frames, message_id, confirmation in batch:
            if confirmation.done():  # withdrawn (cancelled) before it was sent
                continue
            channel.delivery_tag += 1
            tag = channel.delivery_tag
            channel.confirmations[tag] = confirmation  # aiormq matches a return by these
            channel.message_id_delivery_tag[message_id] = tag
            unconfirmed[tag] = (message_id, confirmation)
            numbered.append(tag)
            payload += frames
        if not numbered:
            return
        try:
            await channel.write_queue.put(ChannelFrame(payload=bytes(payload), should_close=False))
        except BaseException as exc:
            # The broker has not seen these: give their delivery tags back.
            channel.delivery_tag = first_tag
            for tag in numbered:
                self._forget(tag)
            _fail(batch, exc)
            raise

    async def _on_confirm(self, frame: ConfirmFrame) -> None:
        """An ack or nack from the broker, in place of aiormq's: settle the messages it
        covers, oldest first. A message the broker returned is settled already (aiormq's
        return handler failed it before this frame arrived, as the broker sends them)."""
        if len(self.channel.confirmations) > len(self._unconfirmed):
            await self._aiormq_confirms(frame)  # plain aiormq publishes are waiting too
        tag = frame.delivery_tag
        if not frame.multiple:
            self._settle(tag, frame)
            return
        unconfirmed = self._unconfirmed
        while unconfirmed and (first := next(iter(unconfirmed))) <= tag:
            self._settle(first, frame)

    def _settle(self, tag: int, frame: ConfirmFrame) -> None:
        confirmation = self._forget(tag)
        if confirmation is None or confirmation.done():  # withdrawn, timed out or returned
            return
        if isinstance(frame, aiormq.spec.Basic.Ack):
            confirmation.set_result(frame)
        else:
            confirmation.set_exception(aiormq.exceptions.DeliveryError(None, frame))

    def _forget(self, tag: int) -> Confirmation | None:
        """Drop a sent message from the pipeline's and aiormq's bookkeeping: its confirm."""
        entry = self._unconfirmed.pop(tag, None)
        if entry is None:
            log.debug("a confirm for delivery tag %d, which is not waiting", tag)
            return None
        message_id, confirmation = entry
        channel = self.channel
        channel.confirmations.pop(tag, None)
        if channel.message_id_delivery_tag.get(message_id) == tag:
            del channel.message_id_delivery_tag[message_id]
        return confirmation

    def _on_close(self, closing: asyncio.Future[Any]) -> None:
        """The channel closed: fail what still waits for a confirm with its close reason (a
        bare `Exception` when it gives none), as aiormq fails the futures it made."""
        if closing.cancelled():
            reason: BaseException = Exception("the channel closed")
        else:
            reason = closing.exception() or Exception("the channel closed")
        for tag in list(self._unconfirmed):
            confirmation = self._forget(tag)
            if confirmation is not None and not confirmation.done():
                confirmation.set_exception(reason)
                confirmation.exception()  # retrieved: a waiter that gave up logs nothing

    def _method_frame(self, exchange: str, routing_key: str) -> bytes:
        key = (exchange, routing_key)
        frame = self._method_frames.get(key)
        if frame is None:
            if len(self._method_frames) >= _METHOD_CACHE_LIMIT:
                self._method_frames.clear()
            publish = aiormq.spec.Basic.Publish(
                exchange=exchange, routing_key=routing_key, mandatory=True
            )
            frame = self._method_frames[key] = amqp_frame.marshal(publish, self.channel.number)
        return frame


def _fail(batch: list[tuple[bytes, str, Confirmation]], exc: BaseException) -> None:
    """Fail messages that were not written: the broker never saw them."""
    error = exc if isinstance(exc, NotSent) else NotSent(f"the publish was abandoned: {exc!r}")
    for _, _, confirmation in batch:
        if not confirmation.done():
            confirmation.set_exception(error)


def _not_sent(channel: aiormq.Channel) -> Confirmation:
    """A failed future for a publish on a closed channel: `NotSent`, with the close reason."""
    closing = channel.closing
    reason = closing.exception() if closing.done() and not closing.cancelled() else None
    confirmation: Confirmation = asyncio.get_running_loop().create_future()
    confirmation.set_exception(NotSent(f"the channel is closed: {reason!r}"))
    return confirmation


class ChannelSet:
    """A few confirm-mode channels shared round-robin, a loop turn at a time, each with its
    pipeline.

    One channel carries many publishes at once (confirms are matched by delivery tag), so
    there is no exclusive checkout. Every publish of one loop turn goes to the same channel,
    so that they leave in one socket write, and the next turn's to the next channel: dealt
    one publish at a time, a turn's publishes took a write per channel (the gateway's single
    publishes on four channels ran at 0.80 of one channel's rate on RabbitMQ 3.10.8, 0.93 on
    4.3.6; a turn at a time, 0.86 and 0.99: docs/benchmarks.md). A channel the broker closed
    is replaced on next use; a robust channel that reconnected gets a pipeline on its new
    underlying channel.
    """

    def __init__(self, factory: ChannelFactory, size: int = 4) -> None:
        self._factory = factory
        self._channels: list[AbstractChannel | None] = [None] * size
        self._pipelines: list[ConfirmPipeline | None] = [None] * size
        self._next = 0  # the slot whose turn it is
        self._serving: ConfirmPipeline | None = None  # this loop turn's, while it fills
        self._locks = [asyncio.Lock() for _ in range(size)]

    def ready(self) -> ConfirmPipeline | None:
        """This loop turn's pipeline, or the next slot's when it is open: the common case,
        with no await. When it is not, the turn stays with that slot, so that `get` opens it:
        were the turn passed on, `ready` and `get` would take alternate slots, and `ready`
        would find unopened ones for good (it did, until 2026-11-27: every publish took
        `get`'s slow path)."""
        serving = self._serving
        if serving is not None and serving.filling and not serving.is_closed:
            return serving
        index = self._next
        pipeline = self._pipelines[index]
        if pipeline is None or pipeline.is_closed:
            return None
        self._next = (index + 1) % len(self._pipelines)
        self._serving = pipeline
        return pipeline

    async def get(self) -> ConfirmPipeline:
        """The next slot's pipeline, opening a channel or following a reconnect as needed."""
        index = self._next
        self._next = (index + 1) % len(self._pipelines)
        pipeline = self._pipelines[index]
        if pipeline is not None and not pipeline.is_closed:
            self._serving = pipeline
            return pipeline
        async with self._locks[index]:
            channel = self._channels[index]
            if channel is None or channel.is_closed:
                channel = self._channels[index] = await self._factory()
            # aio_pika types it abstract; the pipeline needs aiormq's channel.
            underlay = cast(aiormq.Channel, await channel.get_underlay_channel())
            pipeline = self._pipelines[index]
            if pipeline is None or pipeline.channel is not underlay:
                pipeline = self._pipelines[index] = ConfirmPipeline(underlay)
            self._serving = pipeline
            return pipeline

    async def close(self) -> None:
        for channel in self._channels:
            if channel is not None and not channel.is_closed:
                await channel.close()
        self._channels = [None] * len(self._channels)
        self._pipelines = [None] * len(self._pipelines)
        self._serving = None


def confirm_channel_factory(connection: aio_pika.abc.AbstractConnection) -> ChannelFactory:
    async def open_channel() -> AbstractChannel:
        return await connection.channel(publisher_confirms=True, on_return_raises=True)

    return open_channel

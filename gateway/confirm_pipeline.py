"""Confirmed publishing on one aiormq channel, with everything published in one event-loop
turn sent as one socket write.

aiormq's `basic_publish` costs a lock, a timeout, a queue put and a socket write per
message, which is most of the gateway's CPU per message. Here a publish only marshals its
frames and returns the future of its confirm; a flush task, started once per loop turn,
takes the channel's lock, numbers the waiting messages (delivery tags are implicit: the
broker counts publishes in the order it reads them) and hands their frames to the
connection's writer as one payload.

It keeps aiormq's own confirm bookkeeping (`confirmations`, `message_id_delivery_tag`), so
aiormq still resolves each future: Basic.Ack, a nack (`DeliveryError`), a return
(`PublishError`), or the channel's close reason. These are aiormq internals, stable since
aiormq 6; pyproject pins the major version, and the publisher's integration tests cover
every outcome.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel
from aiormq.abc import ChannelFrame
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody

from gateway.amqp_header import content_header_frame

Confirmation = asyncio.Future[Any]
ChannelFactory = Callable[[], Awaitable[AbstractChannel]]

_METHOD_CACHE_LIMIT = 4096


class ConfirmPipeline:
    """Publishes mandatory, persistent-as-given messages on one confirm-mode channel."""

    def __init__(self, channel: aiormq.Channel) -> None:
        if not channel.publisher_confirms:
            raise ValueError("a confirm pipeline needs a channel in confirm mode")
        self.channel = channel
        self._waiting: list[tuple[bytes, str, Confirmation]] = []
        self._flush: asyncio.Task[None] | None = None
        self._method_frames: dict[tuple[str, str], bytes] = {}

    @property
    def is_closed(self) -> bool:
        return self.channel.is_closed

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: aiormq.spec.Basic.Properties,
    ) -> Confirmation:
        """Queue one mandatory publish; the future resolves with the broker's answer.

        `properties.message_id` must be set: aiormq matches a returned message to its publish
        by it. Cancelling the future before its flush withdraws the message.
        """
        message_id = properties.message_id
        if not message_id:
            raise ValueError("a pipelined publish needs a message_id")
        confirmation = self.channel.create_future()
        if confirmation.done():  # the channel closed: aiormq rejects new futures at once
            return confirmation
        number = self.channel.number
        parts = [
            self._method_frame(exchange, routing_key),
            content_header_frame(number, len(body), properties),
        ]
        size = self.channel.max_content_size
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
        first_tag = channel.delivery_tag
        payload = bytearray()
        numbered: list[tuple[int, str, Confirmation]] = []
        for frames, message_id, confirmation in batch:
            if confirmation.done():  # withdrawn (cancelled) before it was sent
                continue
            channel.delivery_tag += 1
            tag = channel.delivery_tag
            channel.confirmations[tag] = confirmation
            channel.message_id_delivery_tag[message_id] = tag
            confirmation.add_done_callback(_forget(channel, message_id, tag))
            numbered.append((tag, message_id, confirmation))
            payload += frames
        if not numbered:
            return
        try:
            await channel.write_queue.put(ChannelFrame(payload=bytes(payload), should_close=False))
        except BaseException as exc:
            # The broker has not seen these: give their delivery tags back.
            channel.delivery_tag = first_tag
            for tag, message_id, confirmation in numbered:
                channel.confirmations.pop(tag, None)
                _forget(channel, message_id, tag)(confirmation)
            _fail(batch, exc)
            raise

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


def _forget(channel: aiormq.Channel, message_id: str, tag: int) -> Callable[[Any], None]:
    """Drop the message_id -> tag entry once settled, unless a later publish reused the id."""

    def forget(_: Any) -> None:
        if channel.message_id_delivery_tag.get(message_id) == tag:
            del channel.message_id_delivery_tag[message_id]

    return forget


def _fail(batch: list[tuple[bytes, str, Confirmation]], exc: BaseException) -> None:
    error = exc if isinstance(exc, Exception) else ConnectionError("the publish was abandoned")
    for _, _, confirmation in batch:
        if not confirmation.done():
            confirmation.set_exception(error)


class ChannelSet:
    """A few confirm-mode channels shared round-robin, each with its pipeline.

    One channel carries many publishes at once (confirms are matched by delivery tag), so
    there is no exclusive checkout. A channel the broker closed is replaced on next use; a
    robust channel that reconnected gets a pipeline on its new underlying channel.
    """

    def __init__(self, factory: ChannelFactory, size: int = 4) -> None:
        self._factory = factory
        self._channels: list[AbstractChannel | None] = [None] * size
        self._pipelines: list[ConfirmPipeline | None] = [None] * size
        self._turn = itertools.cycle(range(size))
        self._locks = [asyncio.Lock() for _ in range(size)]

    def ready(self) -> ConfirmPipeline | None:
        """The next slot's pipeline when it is open: the common case, with no await."""
        pipeline = self._pipelines[next(self._turn)]
        if pipeline is None or pipeline.is_closed:
            return None
        return pipeline

    async def get(self) -> ConfirmPipeline:
        """The next slot's pipeline, opening a channel or following a reconnect as needed."""
        index = next(self._turn)
        pipeline = self._pipelines[index]
        if pipeline is not None and not pipeline.is_closed:
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
            return pipeline

    async def close(self) -> None:
        for channel in self._channels:
            if channel is not None and not channel.is_closed:
                await channel.close()
        self._channels = [None] * len(self._channels)
        self._pipelines = [None] * len(self._pipelines)


def confirm_channel_factory(connection: aio_pika.abc.AbstractConnection) -> ChannelFactory:
    async def open_channel() -> AbstractChannel:
        return await connection.channel(publisher_confirms=True, on_return_raises=True)

    return open_channel

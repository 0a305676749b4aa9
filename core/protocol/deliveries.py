"""A delivery as a worker reads it: the few properties it uses, straight from aiormq.

aio-pika's consumer makes an `IncomingMessage` of every delivery, copying all of its properties
through a `__setattr__` that checks a lock, and runs the callback in a task of its own on top of
the one aiormq runs it in: together about a tenth of the worker's CPU per message. A worker
reads a handful of properties, acks through `bandgate.core.protocol.acks` and nacks to give a
message back, so `Incoming` holds just those (`bandgate.consumers.subscription` consumes with
aiormq).

`Delivered` is what reading and settling need of a delivery; aio-pika's `IncomingMessage` has it
too, so code and tests that get messages from aio-pika (`basic.get`, the DLQ tools) pass those.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from datetime import datetime
from typing import Any, Protocol, cast

from aio_pika.exceptions import ChannelInvalidStateError
from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp.commands import Basic

from bandgate.core.protocol.acks import Unsettled


class Delivered(Protocol):
    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, Any]: ...
    @property
    def message_id(self) -> str | None: ...
    @property
    def delivery_tag(self) -> int | None: ...
    @property
    def priority(self) -> int | None: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def timestamp(self) -> datetime | None: ...
    @property
    def redelivered(self) -> bool | None: ...
    @property
    def channel(self) -> AbstractChannel:
        """The channel it came on; `ChannelInvalidStateError` once that is closed."""
        ...

    def nack(self, *, requeue: bool = ...) -> Awaitable[None]: ...

    def reject(self, *, requeue: bool = ...) -> Awaitable[None]: ...


class Incoming:
    """A `Delivered` made from aiormq's delivery of a consumed message."""

    __slots__ = (
        "body",
        "headers",
        "message_id",
        "delivery_tag",
        "priority",
        "content_type",
        "timestamp",
        "redelivered",
        "unsettled",
        "_channel",
    )

    def __init__(self, delivered: DeliveredMessage, unsettled: Unsettled | None = None) -> None:
        properties = delivered.header.properties
        delivery = cast(Basic.Deliver, delivered.delivery)
        self.body: bytes = delivered.body
        self.headers: Mapping[str, Any] = properties.headers or {}
        self.message_id: str | None = properties.message_id
        self.delivery_tag: int | None = delivery.delivery_tag
        self.priority: int | None = properties.priority
        self.content_type: str | None = properties.content_type
        self.timestamp: datetime | None = properties.timestamp
        self.redelivered: bool | None = delivery.redelivered
        self._channel = delivered.channel
        # Its channel's unsettled deliveries, for acks with `multiple` (`core.protocol.acks`).
        self.unsettled = unsettled
        if unsettled is not None and self.delivery_tag is not None:
            unsettled.tags.add(self.delivery_tag)

    @property
    def channel(self) -> AbstractChannel:
        if self._channel.is_closed:
            raise ChannelInvalidStateError(f"{self._channel!r} is closed")
        return self._channel

    async def nack(self, *, requeue: bool = True) -> None:
        """Give it back to its queue (`requeue`) or drop it."""
        if self.delivery_tag is not None:
            await self.channel.basic_nack(self.delivery_tag, requeue=requeue)
            self._settled()

    async def reject(self, *, requeue: bool = True) -> None:
        """Give it back as a failed delivery: RabbitMQ 4.3 counts a reject, not a nack, in
        `x-delivery-count`."""
        if self.delivery_tag is not None:
            await self.channel.basic_reject(self.delivery_tag, requeue=requeue)
            self._settled()

    def _settled(self) -> None:
        """Written to the channel: an ack with `multiple` sent after it may cover it now."""
        if self.unsettled is not None and self.delivery_tag is not None:
            self.unsettled.tags.discard(self.delivery_tag)

    def __repr__(self) -> str:
        return f"Incoming(message_id={self.message_id!r}, delivery_tag={self.delivery_tag})"

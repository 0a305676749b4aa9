"""Acks, written to the connection together once per event-loop turn.

`channel.basic_ack` marshals each ack through pamqp and hands it to the connection's writer on
its own, which then makes a socket write of 21 bytes; and the writer's queue holds ten frames,
so a worker settling sixteen messages in one turn also waits for room in it. Acking was about
a tenth of the worker's CPU per message. Here an ack is recorded, and once per loop turn every
recorded ack of a connection is written as one payload (`ack_frame` writes the bytes pamqp
would).

Nothing is sent on a channel that is closing or closed: aiormq's own check for an ack, made
again when the acks are written. Such a message is left to the broker, which delivers it again,
as with any ack its channel did not live to send. A worker closes a consumer's channel only once
none of its messages runs, so its last acks went out a loop turn before.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import cast

import aiormq
from aio_pika.exceptions import ChannelInvalidStateError
from aiormq.abc import AbstractChannel, ChannelFrame

log = logging.getLogger(__name__)

# A method frame (type 1) of basic.ack (class 60, method 80): delivery tag, no `multiple`.
_ACK = struct.Struct(">BHIHHQBB")
_ACK_SIZE = _ACK.size - 8  # the frame's own header (7 bytes) and frame end are not counted


def ack_frame(channel_number: int, delivery_tag: int) -> bytes:
    """The frame of `basic.ack(delivery_tag)` on channel `channel_number`."""
    return _ACK.pack(1, channel_number, _ACK_SIZE, 60, 80, delivery_tag, 0, 0xCE)


def closing(channel: AbstractChannel) -> bool:
    """Whether the channel is closed or closing (aiormq sets its close event at either)."""
    close_event: asyncio.Event | None = getattr(channel, "_Channel__close_event", None)
    return channel.is_closed or (close_event is not None and close_event.is_set())


class AckWriter:
    """Collects the acks of a loop turn and writes each connection's as one frame payload."""

    def __init__(self) -> None:
        self._waiting: list[tuple[AbstractChannel, int]] = []
        self._scheduled = False
        self._putting: set[asyncio.Task[None]] = set()

    def ack(self, channel: AbstractChannel, delivery_tag: int) -> None:
        """Ack `delivery_tag` on `channel` at the end of this loop turn;
        `ChannelInvalidStateError` when the channel is closing or closed already."""
        if closing(channel):
            raise ChannelInvalidStateError(f"{channel!r} is closed")
        self._waiting.append((channel, delivery_tag))
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._write)

    def _write(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        payloads: dict[asyncio.Queue[ChannelFrame], bytearray] = {}
        for channel, delivery_tag in waiting:
            if closing(channel):
                log.debug("channel %r closed before ack %d went out", channel, delivery_tag)
                continue
            queue = cast(aiormq.Channel, channel).write_queue
            payload = payloads.setdefault(queue, bytearray())
            payload += ack_frame(channel.number, delivery_tag)
        for queue, payload in payloads.items():
            frame = ChannelFrame(payload=bytes(payload), should_close=False)
            try:
                queue.put_nowait(frame)
            except asyncio.QueueFull:
                # Waiting putters are served in order: a later close still goes out after it.
                task = asyncio.get_running_loop().create_task(queue.put(frame))
                self._putting.add(task)
                task.add_done_callback(self._putting.discard)

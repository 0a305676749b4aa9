"""Acks, written to the connection together once per event-loop turn, and joined into one
`multiple` ack where the broker allows it.

`channel.basic_ack` marshals each ack through pamqp and hands it to the connection's writer on
its own, which then makes a socket write of 21 bytes; and the writer's queue holds ten frames,
so a worker settling sixteen messages in one turn also waits for room in it. Acking was about
a tenth of the worker's CPU per message. Here an ack is recorded, and once per loop turn every
recorded ack of a connection is written as one payload (`ack_frame` writes the bytes pamqp
would).

On a quorum queue every ack is a Raft command of its own (a log entry, a WAL write, a state
machine step): draining a quorum queue cost the broker 115 µs per message with one ack each on
3.10.8 (153 µs on 4.3.6), and 0.78× (0.66×) of that with one `multiple` ack per 4 messages,
0.51× (0.41×) per 8 (`python -m bench acks`). An ack with `multiple` settles every delivery
of the channel up to its tag, so it may only be sent for a tag below every delivery the worker
still holds: a channel's `Unsettled` knows those (a delivery is added as it is read, and leaves
once its ack, nack or reject is written), and the acks of a turn below all of them go out as
one `multiple` ack.
Deliveries are read in tag order (aiormq starts a task per delivery, in order), so none below
an acked tag can still be unread.

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

from bandgate.core.protocol import compat

compat.check_amqp()  # this module writes ack frames and reads aiormq's channel close event

log = logging.getLogger(__name__)

# A method frame (type 1) of basic.ack (class 60, method 80): delivery tag, `multiple` bit.
_ACK = struct.Struct(">BHIHHQBB")
_ACK_SIZE = _ACK.size - 8  # the frame's own header (7 bytes) and frame end are not counted


def ack_frame(channel_number: int, delivery_tag: int, multiple: bool = False) -> bytes:
    """The frame of `basic.ack(delivery_tag, multiple)` on channel `channel_number`."""
    return _ACK.pack(1, channel_number, _ACK_SIZE, 60, 80, delivery_tag, multiple, 0xCE)


def closing(channel: AbstractChannel) -> bool:
    """Whether the channel is closed or closing (aiormq sets its close event at either)."""
    return channel.is_closed or compat.close_event(channel).is_set()


class Unsettled:
    """The delivery tags of one channel that were read and are not settled yet."""

    __slots__ = ("channel", "tags")

    def __init__(self, channel: AbstractChannel) -> None:
        self.channel = channel
        self.tags: set[int] = set()

    def frames(self, delivery_tags: list[int], join: bool = True) -> bytes:
        """The acks of `delivery_tags` (now settled): with `join`, one `multiple` ack for those
        below every tag still unsettled, when there are two or more; one ack for each other."""
        self.tags.difference_update(delivery_tags)
        if not join or len(delivery_tags) < 2:
            return single_acks(self.channel.number, delivery_tags)
        lowest = min(self.tags, default=None)
        below = [tag for tag in delivery_tags if lowest is None or tag < lowest]
        if len(below) < 2:
            return single_acks(self.channel.number, delivery_tags)
        rest = [tag for tag in delivery_tags if lowest is not None and tag > lowest]
        joined = ack_frame(self.channel.number, max(below), multiple=True)
        return joined + single_acks(self.channel.number, rest)


def single_acks(channel_number: int, delivery_tags: list[int]) -> bytes:
    return b"".join(ack_frame(channel_number, tag) for tag in delivery_tags)


class AckWriter:
    """Collects the acks of a loop turn and writes each connection's as one frame payload."""

    def __init__(self) -> None:
        self._waiting: dict[AbstractChannel, tuple[list[int], Unsettled | None]] = {}
        self._scheduled = False
        self._putting: set[asyncio.Task[None]] = set()

    def ack(
        self, channel: AbstractChannel, delivery_tag: int, unsettled: Unsettled | None = None
    ) -> None:
        """Ack `delivery_tag` on `channel` at the end of this loop turn, with the others of
        `unsettled` (the channel's, if known) where one `multiple` ack can settle them;
        `ChannelInvalidStateError` when the channel is closing or closed already."""
        if closing(channel):
            raise ChannelInvalidStateError(f"{channel!r} is closed")
        self._waiting.setdefault(channel, ([], unsettled))[0].append(delivery_tag)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._write)

    def _write(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, {}
        # While earlier acks still wait for room in a writer's queue, a `multiple` ack could
        # overtake them and settle their tags first: the broker would then refuse them.
        join = not self._putting
        payloads: dict[asyncio.Queue[ChannelFrame], bytearray] = {}
        for channel, (delivery_tags, unsettled) in waiting.items():
            if closing(channel):
                log.debug("channel %r closed before acks %s went out", channel, delivery_tags)
                continue
            queue = cast(aiormq.Channel, channel).write_queue
            payload = payloads.setdefault(queue, bytearray())
            if unsettled is None:
                payload += single_acks(channel.number, delivery_tags)
            else:
                payload += unsettled.frames(delivery_tags, join)
        for queue, payload in payloads.items():
            frame = ChannelFrame(payload=bytes(payload), should_close=False)
            try:
                queue.put_nowait(frame)
            except asyncio.QueueFull:
                # A frame put later (a channel close) can take the room before this put wakes;
                # then the broker returns these deliveries at the close: redelivered, not lost.
                task = asyncio.get_running_loop().create_task(queue.put(frame))
                self._putting.add(task)
                task.add_done_callback(self._putting.discard)

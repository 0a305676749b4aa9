"""A minimal blocking AMQP publisher for the benchmarks' load: frames marshalled once.

aio-pika spends about 0.3-0.7 ms of CPU per confirmed publish on the benchmark machine
(~2,000 msg/s per process, whatever the window), and on two cores a load generator that
expensive takes CPU from what is measured. This publisher marshals a message's frames once
(with pamqp, which aiormq uses) into a `Template`, then writes copies with their own message
id and body (of the same length) and counts the broker's confirms, so the broker, not
Python, sets the pace. `fill()` puts a backlog in place with a large confirm window; the
paced hot publisher uses `RawPublisher` directly.

These are load generators only; nothing they do is measured.
"""

from __future__ import annotations

import secrets
import select
import socket
import struct
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote, urlsplit

import aio_pika
from pamqp import base, commands, frame, header
from pamqp.frame import FrameTypes

WINDOW = 5000  # unconfirmed messages at most while filling
CHUNK = 250  # messages per socket write while filling
CHANNEL = 1
ID_LENGTH = 32
_FRAME_BODY = 3
_FRAME_END = b"\xce"

F = TypeVar("F", bound=base.Frame)


class PublishError(RuntimeError):
    """The broker refused, returned or nacked a message, or closed the connection."""


@dataclass
class Confirms:
    """Publisher confirms seen so far: every tag below `low` is confirmed."""

    low: int = 1
    above: set[int] = field(default_factory=set)

    def ack(self, tag: int, multiple: bool) -> None:
        if multiple:
            self.low = max(self.low, tag + 1)
            self.above = {t for t in self.above if t >= self.low}
        else:
            self.above.add(tag)
        while self.low in self.above:
            self.above.discard(self.low)
            self.low += 1

    @property
    def confirmed(self) -> int:
        return self.low - 1


@dataclass(frozen=True)
class Template:
    """The frames of one publish, with holes for the message id and the body."""

    head: bytes  # the publish method frame and the content header up to the message id
    tail: bytes  # the rest of the content header
    body_size: int

    def frames(self, message_id: bytes, body: bytes) -> bytes:
        if len(message_id) != ID_LENGTH or len(body) != self.body_size:
            raise ValueError("a templated message keeps its id and body lengths")
        size = struct.pack(">BHI", _FRAME_BODY, CHANNEL, len(body))
        return b"".join((self.head, message_id, self.tail, size, body, _FRAME_END))


class RawPublisher:
    """One connection, one confirm channel; `send()` templated frames, `poll()` for confirms."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sent = 0
        self.confirms = Confirms()
        self._buffer = b""
        self._handshake(
            unquote(parts.username or "guest"),
            unquote(parts.password or "guest"),
            unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
        )

    def _handshake(self, user: str, password: str, vhost: str) -> None:
        self.sock.sendall(header.ProtocolHeader().marshal())
        self._expect(commands.Connection.Start)
        self._send(
            commands.Connection.StartOk(
                client_properties={"connection_name": "bandgate-bench-load"},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
            channel=0,
        )
        tune = self._expect(commands.Connection.Tune)
        self._send(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
            channel=0,
        )
        self._send(commands.Connection.Open(virtual_host=vhost), channel=0)
        self._expect(commands.Connection.OpenOk)
        self._send(commands.Channel.Open())
        self._expect(commands.Channel.OpenOk)
        self._send(commands.Confirm.Select())
        self._expect(commands.Confirm.SelectOk)

    @staticmethod
    def template(exchange: str, routing_key: str, message: aio_pika.Message) -> Template:
        """`message`'s publish frames (mandatory), its message id left as a hole."""
        properties = message.properties
        placeholder = "#" * ID_LENGTH
        properties.message_id = placeholder
        frames = b"".join(
            frame.marshal(value, CHANNEL)
            for value in (
                commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
                header.ContentHeader(body_size=len(message.body), properties=properties),
            )
        )
        at = frames.index(placeholder.encode())
        return Template(frames[:at], frames[at + ID_LENGTH :], len(message.body))

    def send(self, frames: bytes, count: int = 1) -> None:
        """Write the frames of `count` publishes."""
        self.sock.sendall(frames)
        self.sent += count

    @property
    def unconfirmed(self) -> int:
        return self.sent - self.confirms.confirmed

    def poll(self, timeout: float | None) -> None:
        """Wait up to `timeout` s (None: until something arrives) and take in what the broker
        sent; PublishError on a nack, a returned (unroutable) message or a close."""
        if not self._frames_buffered():
            readable, _, _ = select.select([self.sock], [], [], timeout)
            if not readable:
                return
            self._receive()
        while self._frames_buffered():
            value = self._next_frame()
            if isinstance(value, commands.Basic.Ack):
                self.confirms.ack(value.delivery_tag, value.multiple)
            elif isinstance(value, commands.Basic.Nack):
                raise PublishError(f"the broker nacked message {value.delivery_tag}")
            elif isinstance(value, commands.Basic.Return):
                raise PublishError(
                    f"unroutable: {value.exchange!r} {value.routing_key!r} ({value.reply_text})"
                )

    def wait_confirmed(self) -> None:
        while self.unconfirmed:
            self.poll(None)

    def close(self) -> None:
        try:
            close = commands.Connection.Close(
                reply_code=200, reply_text="done", class_id=0, method_id=0
            )
            self._send(close, channel=0)
            self._expect(commands.Connection.CloseOk)
        except (OSError, PublishError):
            pass  # closing after a failure: the failure is what gets reported
        finally:
            self.sock.close()

    def _send(self, value: FrameTypes, channel: int = CHANNEL) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def _receive(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise PublishError("the broker closed the connection")
        self._buffer += data

    def _frames_buffered(self) -> bool:
        if len(self._buffer) < 7:
            return False
        size: int = struct.unpack_from(">I", self._buffer, 3)[0]
        return len(self._buffer) >= 7 + size + 1

    def _next_frame(self) -> FrameTypes:
        consumed, _, value = frame.unmarshal(self._buffer)
        self._buffer = self._buffer[consumed:]
        if isinstance(value, commands.Connection.Close | commands.Channel.Close):
            raise PublishError(f"the broker closed: {value.reply_text}")
        return value

    def _expect(self, kind: type[F]) -> F:
        while not self._frames_buffered():
            self._receive()
        value = self._next_frame()
        if not isinstance(value, kind):
            raise PublishError(f"expected {kind.__name__}, got {value!r}")
        return value


def message_ids(count: int, start: int = 0) -> list[bytes]:
    """`count` distinct message ids of `ID_LENGTH` characters."""
    nonce = secrets.token_hex(6)  # 12 characters; 20 for the counter
    return [f"{nonce}{n:020x}".encode() for n in range(start, start + count)]


def fill(
    url: str,
    exchange: str,
    routing_key: str,
    message: aio_pika.Message,
    count: int,
    ids: list[bytes] | None = None,
) -> None:
    """Publish `count` copies of `message` (mandatory, confirmed), each with its own id: the
    caller's `ids`, in that order, when it must know them."""
    if count <= 0:
        return
    template = RawPublisher.template(exchange, routing_key, message)
    ids = message_ids(count) if ids is None else ids
    publisher = RawPublisher(url)
    try:
        while publisher.sent < count:
            room = min(CHUNK, count - publisher.sent, WINDOW - publisher.unconfirmed)
            if room <= 0:
                publisher.poll(None)
                continue
            chunk = ids[publisher.sent : publisher.sent + room]
            publisher.send(b"".join(template.frames(id_, message.body) for id_ in chunk), room)
            publisher.poll(0)
        publisher.wait_confirmed()
    finally:
        publisher.close()

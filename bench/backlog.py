"""Filling a backlog fast: a minimal blocking AMQP publisher with a large confirm window.

The benchmarks need tens of thousands of messages in a queue before they start, and aio-pika
spends about 0.3-0.4 ms of CPU per confirmed publish on the benchmark machine (~2,000 msg/s
per process, whatever the window). This publisher marshals a message's frames once (with
pamqp, which aiormq uses), then writes copies of them in large chunks, each with its own
message id, and counts the broker's confirms: the broker, not Python, sets the pace.

It is a load generator for set-up only; nothing it does is measured.
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import unquote, urlsplit

import aio_pika
from pamqp import base, commands, frame, header
from pamqp.body import ContentBody
from pamqp.frame import FrameTypes

WINDOW = 5000  # unconfirmed messages at most
CHUNK = 250  # messages per socket write
_CHANNEL = 1
_ID_LENGTH = 32

F = TypeVar("F", bound=base.Frame)


class FillError(RuntimeError):
    """The broker refused, returned or nacked a message, or closed the connection."""


@dataclass
class _Confirms:
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


class _Connection:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        self._handshake(
            unquote(parts.username or "guest"),
            unquote(parts.password or "guest"),
            unquote(parts.path[1:]) if len(parts.path) > 1 else "/",
        )

    def _handshake(self, user: str, password: str, vhost: str) -> None:
        self.sock.sendall(header.ProtocolHeader().marshal())
        self.expect(commands.Connection.Start)
        self.send(
            commands.Connection.StartOk(
                client_properties={"connection_name": "bandgate-bench-backlog"},
                mechanism="PLAIN",
                response=f"\0{user}\0{password}",
                locale="en_US",
            ),
            channel=0,
        )
        tune = self.expect(commands.Connection.Tune)
        self.send(
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
            channel=0,
        )
        self.send(commands.Connection.Open(virtual_host=vhost), channel=0)
        self.expect(commands.Connection.OpenOk)
        self.send(commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)
        self.send(commands.Confirm.Select())
        self.expect(commands.Confirm.SelectOk)

    def send(self, value: FrameTypes, channel: int = _CHANNEL) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def read(self) -> FrameTypes:
        """The next frame; raises FillError when the broker closes the channel or connection."""
        while True:
            if len(self._buffer) >= 7:
                consumed, _, value = frame.unmarshal(self._buffer)
                if consumed:
                    self._buffer = self._buffer[consumed:]
                    if isinstance(value, commands.Connection.Close | commands.Channel.Close):
                        raise FillError(f"the broker closed: {value.reply_text}")
                    return value
            data = self.sock.recv(65536)
            if not data:
                raise FillError("the broker closed the connection")
            self._buffer += data

    def expect(self, kind: type[F]) -> F:
        value = self.read()
        if not isinstance(value, kind):
            raise FillError(f"expected {kind.__name__}, got {value!r}")
        return value

    def close(self) -> None:
        try:
            close = commands.Connection.Close(
                reply_code=200, reply_text="done", class_id=0, method_id=0
            )
            self.send(close, channel=0)
            self.expect(commands.Connection.CloseOk)
        except (OSError, FillError):
            pass  # closing after a failure: the failure is what gets reported
        finally:
            self.sock.close()


def fill(url: str, exchange: str, routing_key: str, message: aio_pika.Message, count: int) -> None:
    """Publish `count` copies of `message` (mandatory, confirmed), each with its own id."""
    if count <= 0:
        return
    properties = message.properties
    placeholder = "#" * _ID_LENGTH
    properties.message_id = placeholder
    frames = b"".join(
        frame.marshal(value, _CHANNEL)
        for value in (
            commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
            header.ContentHeader(body_size=len(message.body), properties=properties),
            ContentBody(message.body),
        )
    )
    at = frames.index(placeholder.encode())
    before, after = frames[:at], frames[at + _ID_LENGTH :]
    nonce = secrets.token_hex(6)  # 12 characters; 20 for the counter
    connection = _Connection(url)
    try:
        confirms = _Confirms()
        sent = 0
        while confirms.confirmed < count:
            room = min(CHUNK, count - sent, WINDOW - (sent - confirms.confirmed))
            if room > 0:
                connection.sock.sendall(
                    b"".join(
                        before + f"{nonce}{n:020x}".encode() + after
                        for n in range(sent, sent + room)
                    )
                )
                sent += room
                continue
            value = connection.read()
            if isinstance(value, commands.Basic.Ack):
                confirms.ack(value.delivery_tag, value.multiple)
            elif isinstance(value, commands.Basic.Nack):
                raise FillError(f"the broker nacked message {value.delivery_tag}")
            elif isinstance(value, commands.Basic.Return):
                raise FillError(f"unroutable: {exchange!r} {routing_key!r} ({value.reply_text})")
    finally:
        connection.close()

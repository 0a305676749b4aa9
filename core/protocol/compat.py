"""The versions of the libraries whose private parts bandgate's protocol code touches, checked
when that code is imported, so that a release that renamed what it reaches into fails at once
and loudly, not as a silent fallback or a wrong confirm under load.

What each range covers (pyproject.toml pins the same ranges;
tests/unit/test_protocol_compat.py checks they agree):
- aiormq: `core.protocol.confirms` writes its channel's confirm bookkeeping (`delivery_tag`,
  `confirmations`, `message_id_delivery_tag`, `write_queue`) and answers its confirm frames
  in place of `_on_confirm_frame` (`take_confirms`); `core.broker` reads a
  connection's unblocked event and the worker's acks a channel's close event, both
  name-mangled privates, read here only (`unblocked_event`, `close_event`).
- pamqp: `core.protocol.frames` decodes frames itself and reads pamqp's frame and header internals.
- aio-pika: `core.cluster_connection` and `core.broker` lean on its robust connection.
- uvicorn: `gateway.http_server` subclasses its httptools protocol.

A range is the versions tested (aiormq 7.2.4, pamqp 4.0.1, aio-pika 10.2.1, uvicorn 0.40 and
0.54, whose httptools protocol has the same surface): widen it after the suite passed on the
new release.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

ConfirmHandler = Callable[[Any], Awaitable[None]]


class IncompatibleLibrary(ImportError):
    """An installed library is outside the versions bandgate's protocol code was written for."""


@dataclass(frozen=True)
class Supported:
    """Versions `lowest` <= v < `below` of the distribution `name`."""

    name: str
    lowest: str
    below: str
    why: str

    @property
    def specifier(self) -> str:
        """The range as pip writes it (and pyproject.toml pins it)."""
        return f">={self.lowest},<{self.below}"

    def holds_for(self, installed: str) -> bool:
        return _release(self.lowest) <= _release(installed) < _release(self.below)


AIORMQ = Supported("aiormq", "7.2.4", "7.3", "its channel's confirm bookkeeping")
PAMQP = Supported("pamqp", "4.0.1", "4.1", "its frame decoder's internals")
AIO_PIKA = Supported("aio-pika", "10.0", "11", "its robust connection")
UVICORN = Supported("uvicorn", "0.40", "0.55", "its httptools protocol")
SUPPORTED = (AIORMQ, PAMQP, AIO_PIKA, UVICORN)


def _release(text: str) -> tuple[int, ...]:
    """The numeric release of a version ("7.2.4rc1" -> (7, 2, 4)), zero-padded to compare."""
    match = re.match(r"\d+(?:\.\d+)*", text)
    if match is None:
        raise IncompatibleLibrary(f"cannot read the version {text!r}")
    parts = tuple(int(part) for part in match.group().split("."))
    return parts + (0,) * (4 - len(parts))


def check(*libraries: Supported) -> None:
    """Raise `IncompatibleLibrary` unless every one of `libraries` is installed in its range."""
    for library in libraries:
        try:
            installed = version(library.name)
        except PackageNotFoundError:
            raise IncompatibleLibrary(
                f"{library.name} is not installed; bandgate needs {library.name}{library.specifier}"
            ) from None
        if not library.holds_for(installed):
            raise IncompatibleLibrary(
                f"{library.name} {installed} is installed, but bandgate's protocol code uses "
                f"{library.why} as of {library.name}{library.specifier}: install a version in "
                f"that range (pip install 'bandgate' pins it)"
            )


@cache
def check_amqp() -> None:
    """The AMQP libraries: for the modules that reach into aiormq and pamqp."""
    check(AIORMQ, PAMQP, AIO_PIKA)


@cache
def check_uvicorn() -> None:
    """uvicorn: for the gateway's HTTP server."""
    check(UVICORN)


def unblocked_event(connection: object) -> asyncio.Event:
    """An aiormq connection's private Connection.Blocked/Unblocked event (cleared while the
    broker blocks publishing). AttributeError, never a silent default, if aiormq renamed it."""
    event = getattr(connection, "_Connection__connection_unblocked")  # noqa: B009 - mangled name
    assert isinstance(event, asyncio.Event)
    return event


def take_confirms(channel: object, handler: ConfirmHandler) -> ConfirmHandler:
    """Have an aiormq channel's reader hand its Basic.Ack and Basic.Nack frames to `handler`
    instead of its own `_on_confirm_frame`, which the reader looks up on every such frame.
    Returns aiormq's own handler, for confirms that are not `handler`'s. AttributeError if
    aiormq renamed it."""
    own: ConfirmHandler = getattr(channel, "_on_confirm_frame")  # noqa: B009 - private
    setattr(channel, "_on_confirm_frame", handler)  # noqa: B010 - private
    return own


def close_event(channel: object) -> asyncio.Event:
    """An aiormq channel's private close event, set as soon as the channel starts closing
    (`is_closed` turns true only once it has). AttributeError if aiormq renamed it."""
    event = getattr(channel, "_Channel__close_event")  # noqa: B009 - mangled name
    assert isinstance(event, asyncio.Event)
    return event

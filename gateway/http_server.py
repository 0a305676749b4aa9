"""The HTTP server: uvicorn with limits on what a client may send before the app sees it.

uvicorn's httptools protocol keeps reading a request head for as long as it grows: a 50 MB
header was buffered whole (gateway RSS +93 MB) and 100,000 headers reached the app. The
protocol here, an adapter over uvicorn's own (the one module that reaches into it; uvicorn's
version is pinned in pyproject and `tests/integration/test_http_limits.py` runs it for real),
answers 431 once a head passes `max_header_bytes` (uvicorn's `h11_max_incomplete_event_size`,
which means the same for its h11 protocol) or `MAX_HEADERS` headers, and 408 when a head takes
longer than the keep-alive timeout to arrive, so slow clients cannot hold connections open.
uvicorn's own answers come in the API's error shape too: a request its parser refuses (400
`http_error`, was plain text) and one beyond `limit_concurrency` (503 `server_busy`, was
"Service Unavailable").
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from bandgate.core import error_codes
from bandgate.core.error_codes import ErrorCode
from bandgate.core.protocol import compat
from bandgate.gateway.errors import error_body
from bandgate.gateway.settings import GatewaySettings

compat.check_uvicorn()

MAX_HEADERS = 100
LINGER_SECONDS = 1.0
DEFAULT_MAX_HEADER_BYTES = 32 * 1024

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
}


async def server_busy(scope: Scope, receive: Receive, send: Send) -> None:
    """uvicorn's answer beyond `limit_concurrency`, in the error shape."""
    body = orjson.dumps(
        {
            "error": error_body(
                error_codes.SERVER_BUSY,
                "the gateway process serves as many connections and requests as it may; retry",
            )
        }
    )
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"retry-after", b"1"),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class OneWritePerTurn:
    """A connection's transport, for one response: its writes of one event-loop turn go out as
    one. uvicorn writes a response's head and its body apart, two system calls where one does;
    joined, a single-message publish cost the gateway 126.7 µs of CPU against 133.3 µs (medians
    of three interleaved rounds under wrk, 64 connections, RabbitMQ 3.10.8, 2026-11-26)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing oversized or slow request heads."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._max_head_bytes = config.h11_max_incomplete_event_size or DEFAULT_MAX_HEADER_BYTES
        self._refused = False
        self._in_head = True
        self._head_read = 0  # bytes received while a head is incomplete
        self._head_size = 0  # the request line and the headers parsed so far
        self._header_count = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # the lingering rest of a refused request: read and dropped
        super().data_received(data)
        if self._in_head and not self._refused:
            # What the parser holds of a head not yet complete: bounded by the limit plus one
            # read, whatever the client sends.
            self._head_read += len(data)
            if self._head_read > self._max_head_bytes:
                self._refuse(error_codes.HEADERS_TOO_LARGE, self._too_large())
            elif self._head_timer is None:
                self._arm_head_timer()

    def on_message_begin(self) -> None:
        """A head begins. Its timer is armed only if the read that began it ends before the
        head does (`data_received`): a head that arrives whole, as nearly all do, costs no
        timer (arming and cancelling one per request was 1-2 us of CPU)."""
        super().on_message_begin()
        self._in_head = True
        self._head_read = 0
        self._head_size = 0
        self._header_count = 0
        self._disarm_head_timer()

    def on_url(self, url: bytes) -> None:
        if not self._refused:
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._head_size += len(name) + len(value)
        if self._header_count <= MAX_HEADERS and not self._refused:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        if self._refused:
            return
        if self._header_count > MAX_HEADERS:
            self._refuse(error_codes.HEADERS_TOO_LARGE, f"a request may have {MAX_HEADERS} headers")
            return
        if self._head_size + len(self.url) > self._max_head_bytes:
            self._refuse(error_codes.HEADERS_TOO_LARGE, self._too_large())
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refuses, in the error shape."""
        self._refuse(error_codes.HTTP_ERROR, msg, status=400)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if app is service_unavailable:
            app = server_busy
        cycle.transport = OneWritePerTurn(self.transport, self.loop)  # type: ignore[assignment]
        super()._start_asgi_task(cycle, app)

    def _too_large(self) -> str:
        return f"the request line and headers exceed {self._max_head_bytes} bytes"

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_too_slow)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head and not self._refused and not self.transport.is_closing():
            self._refuse(
                error_codes.REQUEST_TIMEOUT,
                f"the request head took over {self.timeout_keep_alive} s",
            )

    def _refuse(self, error: ErrorCode, message: str, status: int | None = None) -> None:
        """Answer in the API's error shape and close. Closing at once, with the client still
        sending, would reset the connection and could destroy the answer before the client
        read it; so the gateway half-closes, drops what still comes for `LINGER_SECONDS`
        (parsing none of it), then closes."""
        self._refused = True
        self._disarm_head_timer()
        status = status or error.status
        assert status is not None
        body = orjson.dumps({"error": error_body(error, message)})
        head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        head += b"connection: close\r\n\r\n"
        self.transport.write(head + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)
        else:
            self.transport.close()


def server_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn's options with the gateway's HTTP limits (README, "HTTP limits"), for
    `uvicorn.run` or `uvicorn.Config`."""
    return {
        "host": settings.host,
        "port": settings.port,
        "http": GuardedHttpProtocol,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": settings.keep_alive_seconds,
        "timeout_graceful_shutdown": settings.http_shutdown_grace_seconds,
        "access_log": settings.access_log,
        "log_level": "info",
    }

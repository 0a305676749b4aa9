"""What the floors under the gateway (`bench.publish_floor`, `bench.pull_floor`) share: a bare
ASGI app that starts and stops with its server, answers readiness, and hands every other
request's JSON body to the floor's handler, with nothing between."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

Handler = Callable[[Scope, Any], Awaitable[tuple[int, bytes]]]  # -> status, JSON body
Hook = Callable[[], Awaitable[None]]

_HEAD = [(b"content-type", b"application/json")]


def floor_app(handle: Handler, start: Hook, stop: Hook) -> ASGIApp:
    """The app: `start` and `stop` with the server's lifespan; GET answers 200 (ready once
    started); any other request, `handle(scope, its JSON body)`."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await receive()  # startup
            await start()
            await send({"type": "lifespan.startup.complete"})
            await receive()  # shutdown
            await stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":
            await _answer(send, 200, b"{}")
            return
        status, body = await handle(scope, orjson.loads(await _read_body(receive)))
        await _answer(send, status, body)

    return app


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [*_HEAD, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message: Message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)

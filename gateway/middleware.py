"""Pure ASGI middleware: the error boundary, the UTF-8 rule for paths, and the body-size
limit, enforced before a byte is parsed."""

from __future__ import annotations

import logging
import re
import uuid
from urllib.parse import unquote_to_bytes

import orjson
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bandgate.core import error_codes
from bandgate.gateway.errors import ApiError, error_body, error_response

log = logging.getLogger(__name__)

# A client's own X-Request-Id is used when it looks like one (it goes into logs).
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


class ErrorBoundary:
    """Turn any exception a request raises into the API's JSON error shape (500
    `internal_error`) with a request id, logged with its traceback under that id.

    The id is made only when something failed (or taken from the client's X-Request-Id), so
    requests that succeed pay nothing for it. A client that hung up before its request was
    read is not a failure of the gateway: one INFO line, no traceback, no 500. The gateway
    serves no WebSocket: an upgrade is answered 404 in the error shape where the server lets
    an app answer one (uvicorn's `websocket.http.response`), else closed.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await refuse_websocket(scope, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except ClientDisconnect:
            log.info(
                "client %s hung up before its request was read: %s %s",
                _client(scope),
                scope.get("method"),
                scope.get("path"),
            )
            if not started:  # for the access log, where the server still writes one
                gone = ApiError.of(error_codes.CLIENT_DISCONNECTED, "the client hung up")
                await error_response(gone)(scope, receive, send)
        except Exception:
            request_id = _request_id(scope)
            log.exception(
                "unexpected error on %s %s (request id %s)",
                scope.get("method"),
                scope.get("path"),
                request_id,
            )
            if started:  # too late for an answer: the server closes the connection
                raise
            error = ApiError.of(
                error_codes.INTERNAL_ERROR,
                f"the gateway failed unexpectedly; quote request id {request_id}",
                headers={"X-Request-Id": request_id},
            )
            await error_response(error, request_id=request_id)(scope, receive, send)


async def refuse_websocket(scope: Scope, send: Send) -> None:
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = orjson.dumps(
        {"error": error_body(error_codes.NOT_FOUND, "the gateway serves no WebSocket")}
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "websocket.http.response.start", "status": 404, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and _REQUEST_ID.fullmatch(value):
            return bytes(value).decode()
    return uuid.uuid4().hex


class Utf8PathMiddleware:
    """Paths and query strings under the rule bodies follow: percent-escapes must be UTF-8.
    The server decodes an escape that is not (`%FF`) to U+FFFD, so different raw ids would
    name one message, and Starlette does the same to a query (`?reason=%FF` filtered dead
    letters by U+FFFD): such a request is refused (400 `malformed_path`). Only a path holding
    U+FFFD is looked at again, in its raw form (one that escapes U+FFFD itself is valid), and
    only a query holding an escape or a byte beyond ASCII."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (where := _not_utf8(scope)) is not None:
            error = ApiError.of(
                error_codes.MALFORMED_PATH,
                f"the {where}'s percent-escapes are not UTF-8 (escape UTF-8 bytes: %C3%A9)",
            )
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _not_utf8(scope: Scope) -> str | None:
    """The part of the URL (path or query) whose percent-escapes, or raw bytes, are not
    UTF-8; None when both are."""
    raw = scope.get("raw_path")
    query: bytes = scope.get("query_string", b"")
    try:
        if raw is not None and "\ufffd" in scope["path"]:
            unquote_to_bytes(raw.split(b"?", 1)[0]).decode()
    except UnicodeDecodeError:
        return "path"
    try:
        if b"%" in query or not query.isascii():
            unquote_to_bytes(query).decode()
    except UnicodeDecodeError:
        return "query"
    return None


def too_large(limit: int) -> ApiError:
    return ApiError.of(
        error_codes.BODY_TOO_LARGE, f"request body exceeds the limit of {limit} bytes"
    )


class BodyLimitMiddleware:
    """Refuse bodies over `limit` bytes with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await error_response(too_large(self.limit))(scope, receive, send)
                    return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit)
            return message

        await self.app(scope, limited_receive, send)

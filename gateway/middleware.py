"""Pure ASGI middleware: the error boundary, and the body-size limit, enforced before a byte
is parsed."""

from __future__ import annotations

import logging
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bandgate.core import error_codes
from bandgate.gateway.errors import ApiError, error_response

log = logging.getLogger(__name__)

# A client's own X-Request-Id is used when it looks like one (it goes into logs).
_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


class ErrorBoundary:
    """Turn any exception a request raises into the API's JSON error shape (500
    `internal_error`) with a request id, logged with its traceback under that id.

    The id is made only when something failed (or taken from the client's X-Request-Id), so
    requests that succeed pay nothing for it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id" and _REQUEST_ID.fullmatch(value):
            return bytes(value).decode()
    return uuid.uuid4().hex


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

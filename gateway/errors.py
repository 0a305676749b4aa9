"""Errors the HTTP API answers with, in the one documented shape:
`{"error": {"code": ..., "message": ..., "field": ...}}`. Every code is one of the registry
(`core.error_codes`): `ApiError.of` takes its status from there."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from bandgate.core import error_codes
from bandgate.core.error_codes import ErrorCode


class ApiError(Exception):
    """An error with its HTTP status and stable machine-readable code. Raise `ApiError.of` a
    registered code; the constructor takes the status explicitly (for a status the code has
    not of its own, or one forwarded from another process), and refuses a code the registry
    lacks."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.error = error_codes.lookup(code)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers

    @classmethod
    def of(
        cls,
        error: ErrorCode,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> ApiError:
        """`error` with its registered status."""
        assert error.status is not None, f"{error.code} has no status of its own"
        return cls(error.status, error.code, message, field, headers)

    def body(self) -> dict[str, Any]:
        return error_body(self.error, self.message, self.field)


def error_body(error: ErrorCode, message: str, field: str | None = None) -> dict[str, Any]:
    """The `error` member of an error response."""
    return {"code": error.code, "message": message, "field": field}


def error_response(error: ApiError, request_id: str | None = None) -> Response:
    body = error.body()
    if request_id is not None:
        body["request_id"] = request_id
    return Response(
        orjson.dumps({"error": body}),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    count_rejected(request, exc.code)
    return error_response(exc)


def count_rejected(request: Request, code: str, amount: int = 1) -> None:
    """Count a refused request by reason; unknown queue names are not used as labels. A 429
    is counted under its token's name too (names are configured, so their number is bounded):
    which tenant runs into its limits."""
    telemetry = getattr(request.app.state, "telemetry", None)
    if telemetry is None:
        return
    queue = request.path_params.get("queue")
    if queue not in request.app.state.topology.queues:
        queue = "-"
    telemetry.rejected.labels(queue, code).inc(amount)
    principal = request.scope.get("state", {}).get("principal")
    if principal is not None and error_codes.lookup(code).status == 429:
        telemetry.token_refused.labels(principal.name, code).inc(amount)


_HTTP_CODES = {
    404: error_codes.NOT_FOUND,
    405: error_codes.METHOD_NOT_ALLOWED,
}


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in our error shape; any other status of Starlette's as
    `http_error`."""
    assert isinstance(exc, HTTPException)
    error = _HTTP_CODES.get(exc.status_code, error_codes.HTTP_ERROR)
    headers = dict(exc.headers) if exc.headers else None
    count_rejected(request, error.code)
    return error_response(ApiError(exc.status_code, error.code, str(exc.detail), headers=headers))

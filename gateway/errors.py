"""Errors the HTTP API answers with, in the one documented shape:
`{"error": {"code": ..., "message": ..., "field": ...}}`."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response


class ApiError(Exception):
    """An error with its HTTP status and stable machine-readable code."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "field": self.field}


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
    """Count a refused request by reason; unknown queue names are not used as labels."""
    telemetry = getattr(request.app.state, "telemetry", None)
    if telemetry is None:
        return
    queue = request.path_params.get("queue")
    if queue not in request.app.state.topology.queues:
        queue = "-"
    telemetry.rejected.labels(queue, code).inc(amount)


_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
}


async def http_error_handler(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in our error shape."""
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else None
    count_rejected(request, code)
    return error_response(ApiError(exc.status_code, code, str(exc.detail), headers=headers))

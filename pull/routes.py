"""HTTP endpoints of the receivers (v1): receive, ack (one or a batch), release, extend.

Requests are checked here, at the edge, into the documented error shape; the `Receivers` of
the process (`bandgate.pull.service`) does the rest. Every endpoint needs `consume:<queue>`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from bandgate.consumers import MAX_REASON_CHARS
from bandgate.core import error_codes
from bandgate.gateway.auth import authorize, charge
from bandgate.gateway.errors import ApiError, count_rejected
from bandgate.gateway.routes import json_body, queue_spec, topology_of
from bandgate.gateway.schemas import validation_error
from bandgate.pull.leases import Lease
from bandgate.pull.receipts import MAX_RECEIPT_CHARS
from bandgate.pull.service import Receivers, iso
from bandgate.pull.settings import MAX_MESSAGES, MAX_VISIBILITY_SECONDS, MAX_WAIT_SECONDS

MAX_ACK_BATCH = 100

Receipt = Field(min_length=1, max_length=MAX_RECEIPT_CHARS)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ReceiveRequest(_Strict):
    max_messages: int = Field(default=1, ge=1, le=MAX_MESSAGES)
    wait_seconds: float = Field(default=0, ge=0, le=MAX_WAIT_SECONDS)
    visibility_timeout: float | None = Field(default=None, gt=0, le=MAX_VISIBILITY_SECONDS)
    ack: list[str] | None = Field(
        default=None,
        description="receipts to ack before receiving (the previous batch's): one round trip "
        "per batch instead of two; each one's result in the answer's `ack`",
    )


class AckBatchRequest(_Strict):
    receipts: list[str] = Field(min_length=1)


class ReleaseRequest(_Strict):
    receipt: str = Receipt
    delay_seconds: float | None = Field(default=None, ge=0)
    reason: str | None = Field(default=None, max_length=MAX_REASON_CHARS)
    dead_letter: StrictBool = False


class ExtendRequest(_Strict):
    receipt: str = Receipt
    visibility_timeout: float = Field(ge=0, le=MAX_VISIBILITY_SECONDS)


def _json(data: Any, status: int = 200) -> Response:
    return Response(
        orjson.dumps(data, default=_header_value),
        status_code=status,
        media_type="application/json",
    )


def _header_value(value: Any) -> Any:
    """AMQP header values JSON has no type for (bytes, decimals, timestamps), as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _receivers(request: Request) -> Receivers:
    receivers: Receivers = request.app.state.receivers
    return receivers


async def _body(request: Request, model: type[_Strict]) -> Any:
    data = await json_body(request)
    if not isinstance(data, dict):
        raise ApiError.of(error_codes.INVALID_BODY, "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _consumer(request: Request) -> str:
    """Check the scope; the name leases are counted under."""
    queue = request.path_params["queue"]
    authorize(request, "consume", queue)
    queue_spec(request)
    return str(request.state.principal.name)


def message_body(lease: Lease) -> dict[str, Any]:
    message = lease.message
    return {
        "message_id": message.message_id,
        "receipt": lease.receipt,
        "payload": message.payload,
        "priority": message.priority,
        "band": message.band,
        "attempt": message.attempt,
        "receive_count": message.delivery_count + 1,
        "enqueued_at": iso(message.enqueued_at),
        "visible_until": iso(lease.visible_until),
        "headers": dict(message.headers),
        "partition_key": message.partition_key,
        "tenant": message.tenant,
    }


async def receive(request: Request) -> Response:
    """Settle `ack` first, as the batch ack does (a receive that then fails leaves them
    settled), then lease."""
    owner = _consumer(request)
    spec = queue_spec(request)
    asked: ReceiveRequest = await _body(request, ReceiveRequest)
    acked = None if asked.ack is None else await _ack_all(request, asked.ack, "ack")
    receivers = _receivers(request)
    visibility = asked.visibility_timeout or receivers.settings.default_visibility_seconds
    receiving = asyncio.ensure_future(
        receivers.receive(spec, asked.max_messages, asked.wait_seconds, visibility, owner)
    )
    watcher = asyncio.ensure_future(_hang_up(request, receiving))
    try:
        leases = await receiving  # cancelled with this request's task (the server stops)
    except asyncio.CancelledError:
        if not _ended_by(watcher):
            raise
        # The client left: what this receive leased went back (`PullQueue.receive`).
        return Response(status_code=499)  # nobody reads it
    finally:
        watcher.cancel()
    answer: dict[str, Any] = {"messages": [message_body(lease) for lease in leases]}
    if acked is not None:
        answer["ack"] = acked
    return _json(answer)


def _ended_by(watcher: asyncio.Future[bool]) -> bool:
    """Whether `watcher` (`_hang_up`) saw the client leave."""
    return watcher.done() and not watcher.cancelled() and watcher.exception() is None


async def _hang_up(request: Request, receiving: asyncio.Future[Any]) -> bool:
    """Cancel a receive when its client closes the connection (its body is read already), so
    that a long poll's leases go back at once; True then.

    The receive runs in a task of its own, which the request's task awaits directly: each
    lease the receive waits for resumes that short task, not the request's, which would pass
    through every middleware's coroutine (measured: the request's task running the receive
    itself saved no CPU); and its result wakes the request in the next loop turn, where an
    `asyncio.wait` racing it against this watcher, then a gather of both, took several more.
    This coroutine holds nothing that leads back to its task: cancelled, the task keeps the
    `CancelledError`, whose traceback holds this frame, and a reference from here to the task
    (a watcher object's method) made every request's objects, its leases and messages too,
    cyclic garbage (about 70 objects per message), left to the young collections of
    `bandgate.core.heap`: up to 117 ms each, about once a second, under the hot bench's load."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    receiving.cancel()
    return True


async def ack(request: Request) -> Response:
    _consumer(request)
    await _receivers(request).ack(request.path_params["queue"], request.path_params["receipt"])
    return Response(status_code=204)


async def ack_batch(request: Request) -> Response:
    _consumer(request)
    asked: AckBatchRequest = await _body(request, AckBatchRequest)
    return _json(await _ack_all(request, asked.receipts, "receipts", paid=1))


async def _ack_all(
    request: Request, receipts: list[str], field: str, paid: int = 0
) -> dict[str, Any]:
    """Ack each of `receipts` (the body's `field`), charged one each beyond the `paid` the
    request's own cost covers: which were acked, and which failed with the error a single
    ack would answer."""
    if len(receipts) > MAX_ACK_BATCH:
        raise ApiError.of(
            error_codes.BATCH_TOO_LARGE, f"a batch holds at most {MAX_ACK_BATCH} receipts", field
        )
    charge(request, len(receipts) - paid)
    errors = await _receivers(request).ack_all(request.path_params["queue"], receipts)
    successful: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for index, (receipt, error) in enumerate(zip(receipts, errors, strict=True)):
        if error is None:
            successful.append({"index": index, "receipt": receipt})
            continue
        problem = {**error.body(), "field": f"{field}.{index}"}
        failed.append({"index": index, "receipt": receipt, "error": problem})
        count_rejected(request, error.code)
    return {"successful": successful, "failed": failed}


async def release(request: Request) -> Response:
    _consumer(request)
    asked: ReleaseRequest = await _body(request, ReleaseRequest)
    longest = topology_of(request).ladder.max_delay_ms / 1000
    if asked.delay_seconds is not None and asked.delay_seconds > longest:
        raise ApiError.of(
            error_codes.INVALID_FIELD,
            f"delay_seconds: at most {longest:g} (the delay ladder's longest delay)",
            "delay_seconds",
        )
    if asked.dead_letter and asked.delay_seconds is not None:
        raise ApiError.of(
            error_codes.CONFLICTING_FIELDS,
            "delay_seconds says when to retry; dead_letter says never: send one",
            "delay_seconds",
        )
    result = await _receivers(request).release(
        request.path_params["queue"],
        asked.receipt,
        asked.delay_seconds,
        asked.reason,
        asked.dead_letter,
    )
    return _json(result)


async def extend(request: Request) -> Response:
    _consumer(request)
    asked: ExtendRequest = await _body(request, ExtendRequest)
    result = await _receivers(request).extend(
        request.path_params["queue"], asked.receipt, asked.visibility_timeout
    )
    return _json(result)


def routes() -> list[BaseRoute]:
    return [
        Route("/v1/queues/{queue}/receive", receive, methods=["POST"]),
        Route("/v1/queues/{queue}/receipts/ack", ack_batch, methods=["POST"]),
        Route("/v1/queues/{queue}/receipts/release", release, methods=["POST"]),
        Route("/v1/queues/{queue}/receipts/extend", extend, methods=["POST"]),
        Route("/v1/queues/{queue}/receipts/{receipt}", ack, methods=["DELETE"]),
    ]


__all__ = ["message_body", "routes"]

"""The HTTP edge's own rules (issue 33, findings 7-11), on a small app behind the gateway's
middleware: cross-site requests and foreign hosts refused, paths under the UTF-8 rule, a
client that hangs up logged as such, WebSocket upgrades and uvicorn's own answers in the error
shape, and log messages on one line. `tests/integration/test_http_edge.py` replays them on the
real server."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from bandgate.gateway import log_lines
from bandgate.gateway.cross_site import CrossSiteGuard, host_name, local_hosts
from bandgate.gateway.errors import ApiError, api_error_handler
from bandgate.gateway.http_server import server_busy
from bandgate.gateway.middleware import ErrorBoundary, Utf8PathMiddleware

CALLS: list[str] = []


async def record(request: Request) -> Response:
    CALLS.append(f"{request.method} {request.path_params.get('id', '')}")
    return JSONResponse({"id": request.path_params.get("id")})


async def read_body(request: Request) -> Response:
    await request.body()
    return JSONResponse({})


def app(**guard: Any) -> Starlette:
    return Starlette(
        routes=[
            Route("/v1/replay", record, methods=["GET", "POST", "DELETE"]),
            Route("/v1/ids/{id}", record, methods=["GET", "DELETE"]),
            Route("/v1/body", read_body, methods=["POST"]),
        ],
        middleware=[
            Middleware(ErrorBoundary),
            Middleware(CrossSiteGuard, **guard),
            Middleware(Utf8PathMiddleware),
        ],
        exception_handlers={ApiError: api_error_handler},
    )


def http(application: Starlette) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=application)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway:8000")


@pytest.fixture
def client() -> httpx.AsyncClient:
    CALLS.clear()
    return http(app())


def code(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("POST", {"origin": "http://evil.example"}),  # fetch(..., {mode: "no-cors"})
        ("POST", {"origin": "null"}),  # an opaque origin: a sandboxed frame, a file
        ("DELETE", {"origin": "http://gateway:8001"}),  # another port is another origin
        ("POST", {"origin": "http://gateway.evil.example:8000"}),
        ("POST", {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}),
        ("GET", {"sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"}),  # an <img>
        ("GET", {"sec-fetch-site": "same-site", "sec-fetch-mode": "cors"}),
    ],
)
async def test_a_cross_site_browser_request_is_refused_before_the_route(
    client: httpx.AsyncClient, method: str, headers: dict[str, str]
) -> None:
    response = await client.request(method, "/v1/replay", headers=headers)
    assert code(response) == (403, "cross_site_request")
    assert CALLS == []


@pytest.mark.parametrize(
    ("method", "headers"),
    [
        ("POST", {}),  # curl, httpx, the worker library: no Origin
        ("POST", {"origin": "http://gateway:8000", "sec-fetch-site": "same-origin"}),  # console
        ("GET", {"origin": "http://evil.example"}),  # a read: CORS keeps its answer from the page
        ("GET", {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"}),  # a link
        ("DELETE", {"sec-fetch-site": "none"}),  # typed into the address bar
    ],
)
async def test_other_requests_pass(
    client: httpx.AsyncClient, method: str, headers: dict[str, str]
) -> None:
    assert (await client.request(method, "/v1/replay", headers=headers)).status_code == 200
    assert [f"{method} "] == CALLS


async def test_allowed_origins_may_send_state_changing_requests() -> None:
    guarded = http(app(allowed_origins=("https://ops.example.com/",)))
    headers = {"origin": "https://OPS.example.com"}
    assert (await guarded.post("/v1/replay", headers=headers)).status_code == 200
    refused = await guarded.post("/v1/replay", headers={"origin": "https://other.example.com"})
    assert code(refused) == (403, "cross_site_request")


async def test_with_allowed_hosts_another_host_is_refused_against_dns_rebinding() -> None:
    CALLS.clear()
    guarded = http(app(allowed_hosts=local_hosts("127.0.0.1")))
    # A rebinding page's Origin matches the Host it sends: only the Host tells.
    rebound = {"host": "attacker.example:8000", "origin": "http://attacker.example:8000"}
    assert code(await guarded.post("/v1/replay", headers=rebound)) == (403, "host_not_allowed")
    assert code(await guarded.get("/v1/replay", headers={"host": "attacker.example"})) == (
        403,
        "host_not_allowed",
    )
    assert CALLS == []
    for host in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000"):
        assert (await guarded.post("/v1/replay", headers={"host": host})).status_code == 200, host


def test_the_hosts_of_a_local_gateway() -> None:
    assert local_hosts("127.0.0.1") == ("localhost", "127.0.0.1", "::1")
    assert local_hosts("0.0.0.0") == ("localhost", "127.0.0.1", "::1")
    assert local_hosts("192.168.1.5")[-1] == "192.168.1.5"
    assert [host_name(h) for h in ("a:1", "[::1]:80", "::1", "A.b")] == ["a", "::1", "::1", "a.b"]


async def test_a_path_id_follows_the_utf8_rule_of_bodies(client: httpx.AsyncClient) -> None:
    response = await client.delete("/v1/ids/%FF")
    assert code(response) == (400, "malformed_path")
    assert code(await client.get("/v1/ids/a%C3")) == (400, "malformed_path")
    assert CALLS == []  # not collapsed into the id "\ufffd"
    assert (await client.get("/v1/ids/%EF%BF%BD")).json() == {
        "id": "\ufffd"
    }  # U+FFFD, escaped right
    assert (await client.get("/v1/ids/%C3%A9")).json() == {"id": "é"}


async def test_a_query_follows_the_utf8_rule_of_bodies(client: httpx.AsyncClient) -> None:
    """`?reason=%FF` became U+FFFD in Starlette's query parameters: refused like a path."""
    CALLS.clear()
    for query in ("reason=%FF", "reason=a%C3", "%FF=1"):
        response = await client.get(f"/v1/replay?{query}")
        assert code(response) == (400, "malformed_path"), query
        assert "query" in response.json()["error"]["message"]
    assert CALLS == []
    for query in ("reason=%C3%A9", "reason=%EF%BF%BD", "limit=5&reason=a+b", ""):
        assert (await client.get(f"/v1/replay?{query}")).status_code == 200, query


async def test_a_client_that_hangs_up_mid_body_is_one_info_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 8: `Content-Length: 100`, 11 bytes, then the connection closed."""
    sent: list[Message] = []
    parts: list[Message] = [
        {"type": "http.request", "body": b"01234567890", "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return parts.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/body",
        "raw_path": b"/v1/body",
        "query_string": b"",
        "headers": [(b"content-length", b"100"), (b"content-type", b"application/json")],
        "client": ("10.0.0.9", 4711),
        "server": ("gateway", 8000),
        "scheme": "http",
        "root_path": "",
        "http_version": "1.1",
    }
    with caplog.at_level(logging.INFO, "bandgate.gateway"):
        await app()(scope, receive, send)
    records = [r for r in caplog.records if r.name.startswith("bandgate.gateway")]
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.INFO, None)]
    assert "10.0.0.9:4711 hung up" in records[0].getMessage()
    assert sent[0]["status"] == 499  # for the access log; the server drops it


async def test_a_websocket_upgrade_is_answered_in_the_error_shape() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    scope: dict[str, Any] = {"type": "websocket", "path": "/v1/x", "headers": []}
    await app()({**scope, "extensions": {"websocket.http.response": {}}}, receive, send)
    assert [m["type"] for m in sent] == [
        "websocket.http.response.start",
        "websocket.http.response.body",
    ]
    assert sent[0]["status"] == 404
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "not_found"
    sent.clear()
    await app()(scope, receive, send)  # a server without the extension: closed
    assert sent == [{"type": "websocket.close", "code": 1008}]


async def test_uvicorns_busy_answer_is_in_the_error_shape() -> None:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        raise AssertionError

    await server_busy({"type": "http"}, receive, send)
    assert sent[0]["status"] == 503
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "server_busy"


def test_log_messages_stay_on_one_line() -> None:
    assert log_lines.escape("plain é ü") == "plain é ü"
    assert log_lines.escape("a\nb\r\tc\x1b[31m\x7f\x85\u2028") == (
        "a\\nb\\r\\tc\\x1b[31m\\x7f\\x85\\u2028"
    )


@pytest.fixture
def record_factory() -> Any:
    previous = logging.getLogRecordFactory()
    yield
    logging.setLogRecordFactory(previous)


@pytest.mark.usefixtures("record_factory")
def test_client_text_in_any_log_line_is_escaped_and_tracebacks_keep_their_lines() -> None:
    """Finding 9: a release's reason with a newline forged a log line."""
    log_lines.install()
    log_lines.install()  # idempotent
    assert logging.getLogRecordFactory() is log_lines.EscapedLogRecord
    reason = "boom\n2026-11-26 06:30:00,000 CRITICAL bandgate.gateway.auth: token 'admin' leaked"
    formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    try:
        raise ValueError("x")
    except ValueError:
        record = logging.getLogger("bandgate.consumers.runner").makeRecord(
            "bandgate.consumers.runner",
            logging.ERROR,
            __file__,
            1,
            "dead-lettering message %s: %s",
            ("m-1", reason),
            __import__("sys").exc_info(),
        )
    text = formatter.format(record)
    first, *traceback = text.splitlines()
    assert first == (
        "ERROR bandgate.consumers.runner: dead-lettering message m-1: boom\\n2026-11-26 "
        "06:30:00,000 CRITICAL bandgate.gateway.auth: token 'admin' leaked"
    )
    assert traceback[0] == "Traceback (most recent call last):"
    assert not any("CRITICAL" in line for line in traceback)


@pytest.mark.usefixtures("record_factory")
def test_a_record_factory_set_before_keeps_making_the_records() -> None:
    class Traced(logging.LogRecord):
        traced = True

    logging.setLogRecordFactory(Traced)
    log_lines.install()
    log_lines.install()
    record = logging.getLogRecordFactory()("n", logging.INFO, "f", 1, "a%s", ("\nb",), None)
    assert isinstance(record, Traced)
    assert record.getMessage() == "a\\nb"

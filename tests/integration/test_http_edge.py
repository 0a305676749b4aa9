"""Issue 33, findings 7-11, replayed on the real server (`bandgate gateway`: uvicorn, the
gateway and the HTTP receivers) over raw sockets where a client library would not send it:
a cross-site body-less replay refused with the DLQ unchanged, a client hanging up mid-body
(no ERROR line, no traceback), a newline in a release's reason escaped in the log, an
invalid UTF-8 path id refused, and uvicorn's own answers in the JSON error shape."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.ops.local_broker import free_port
from bandgate.topology.loader import parse_topology
from tests.integration.conftest import queue_depths
from tests.integration.test_dead_letters import SAMPLES, dead_letter

pytestmark = [pytest.mark.integration]

TOPOLOGY = """
exchange = "bandgate"
[delay]
levels = 4
[queues.orders]
"""
FORGED = "2026-11-26 06:30:00,000 CRITICAL bandgate.gateway.auth: token 'admin' leaked"


class Gateway:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


def start_gateway(amqp_url: str, tmp_path: Path, **env: str) -> Gateway:
    topology = tmp_path / "bandgate.toml"
    topology.write_text(TOPOLOGY)
    port = free_port()
    log = tmp_path / "gateway.log"
    variables = {
        **os.environ,
        "BANDGATE_AMQP_URL": amqp_url,
        "BANDGATE_TOPOLOGY": str(topology),
        "BANDGATE_PORT": str(port),
        "BANDGATE_AUTH_ENABLED": "false",
        "BANDGATE_ACCESS_LOG": "false",
        **env,
    }
    command = [str(Path(sys.executable).parent / "bandgate"), "gateway"]
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, env=variables, stderr=stderr)
    server = Gateway(process, port, log)
    deadline = time.monotonic() + 90  # seconds, unless the machine is loaded
    while True:
        assert process.poll() is None, "the gateway exited:\n" + log.read_text()
        assert time.monotonic() < deadline, "the gateway did not become ready"
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop(server: Gateway) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@pytest.fixture
def gateway(amqp_url: str, tmp_path: Path) -> Iterator[Gateway]:
    server = start_gateway(amqp_url, tmp_path)
    try:
        yield server
    finally:
        stop(server)


def exchange(server: Gateway, request: bytes) -> tuple[int, bytes]:
    """Send raw bytes, read until the server closes or 5 s pass: (status, body)."""
    with server.connect() as sock:
        sock.sendall(request)
        sock.settimeout(5)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if length and len(body) >= length[0]:
                    break
        except TimeoutError:
            pass
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def error_code(body: bytes) -> str:
    code: str = orjson.loads(body)["error"]["code"]
    return code


def errors_logged(server: Gateway) -> list[str]:
    return [line for line in server.lines() if " ERROR " in line or "Traceback" in line]


def test_a_client_hanging_up_mid_body_is_no_error(gateway: Gateway) -> None:
    """Finding 8: `Content-Length: 100`, 11 bytes, close; 20 times."""
    for _ in range(20):
        with gateway.connect() as sock:
            sock.sendall(
                b"POST /v1/queues/orders/messages HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                b'{"payload":'
            )
    time.sleep(1)
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    assert errors_logged(gateway) == []
    hung_up = [line for line in gateway.lines() if "hung up before its request was read" in line]
    assert len(hung_up) == 20, gateway.lines()[-5:]
    assert all(" INFO " in line for line in hung_up)


async def test_a_newline_in_a_release_reason_stays_on_its_log_line(
    gateway: Gateway,
) -> None:
    """Finding 9: the worker library logs a release's reason; it forged a log line."""
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        published = await http.post("/v1/queues/orders/messages", json={"payload": 1})
        assert published.status_code == 201, published.text
        received = await http.post("/v1/queues/orders/receive", json={"wait_seconds": 5})
        (message,) = received.json()["messages"]
        released = await http.post(
            "/v1/queues/orders/receipts/release",
            json={"receipt": message["receipt"], "reason": f"no\n{FORGED}", "dead_letter": True},
        )
        assert released.status_code == 200, released.text
    deadline = time.monotonic() + 10
    while not any("no\\n2026-11-26" in line for line in gateway.lines()):
        assert time.monotonic() < deadline, gateway.lines()[-5:]
        await asyncio.sleep(0.1)
    assert not any(line.startswith(FORGED[:20]) for line in gateway.lines())


def test_an_invalid_utf8_path_id_is_refused_as_a_body_would_be(gateway: Gateway) -> None:
    """Finding 10: `DELETE .../messages/%FF` cancelled the id U+FFFD."""
    response = httpx.delete(f"{gateway.url}/v1/queues/orders/messages/%FF")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "malformed_path")
    fine = httpx.delete(f"{gateway.url}/v1/queues/orders/messages/%C3%A9t%C3%A9")
    assert fine.status_code == 202, fine.text
    assert fine.json()["message_id"] == "été"


def test_uvicorns_own_answers_are_in_the_error_shape(gateway: Gateway) -> None:
    """Finding 11: a request the parser refuses (plain-text 400 before) and a WebSocket
    upgrade (an empty 403 before)."""
    status, body = exchange(gateway, b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    assert (status, error_code(body)) == (400, "http_error")
    upgrade = (
        b"GET /v1/queues HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    status, body = exchange(gateway, upgrade)
    assert (status, error_code(body)) == (404, "not_found")
    assert errors_logged(gateway) == []


def test_beyond_the_connection_limit_the_answer_is_in_the_error_shape(
    amqp_url: str, tmp_path: Path
) -> None:
    server = start_gateway(amqp_url, tmp_path, BANDGATE_MAX_CONNECTIONS="2")
    try:
        with server.connect(), server.connect():  # two idle connections hold the limit
            time.sleep(0.2)
            status, body = exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, error_code(body)) == (503, "server_busy")
    finally:
        stop(server)


@pytest.mark.parametrize(
    "headers",
    [
        {"origin": "http://evil.example"},  # fetch(..., {method: "POST", mode: "no-cors"})
        {"origin": "null", "sec-fetch-site": "cross-site", "sec-fetch-mode": "no-cors"},
    ],
)
async def test_a_cross_site_body_less_replay_is_refused_and_the_dlq_unchanged(
    gateway: Gateway,
    amqp: AbstractRobustConnection,
    headers: dict[str, str],
) -> None:
    """Finding 7: a page on another origin replayed the whole DLQ of `bandgate dev` (no
    token needed) with a body-less POST, which needs no CORS preflight."""
    topology = parse_topology({"delay": {"levels": 4}, "queues": {"orders": {}}})
    publisher = Publisher(topology, ChannelSet(confirm_channel_factory(amqp)))
    for sample in SAMPLES:
        await dead_letter(publisher, sample)
    async with httpx.AsyncClient(base_url=gateway.url) as http:
        for path in ("/v1/queues/orders/dlq/replay", "/v1/console/queues/orders/dlq/replay"):
            refused = await http.post(path, headers=headers)
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["error"]["code"] == "cross_site_request"
        purge = await http.delete("/v1/queues/orders/dlq", headers=headers)
        assert purge.status_code == 403
        assert (await queue_depths(amqp, topology))["orders.dlq"] == len(SAMPLES)
        # The same request without a browser's Origin (curl) still replays.
        replayed = await http.post("/v1/queues/orders/dlq/replay")
        assert replayed.status_code == 200, replayed.text
    assert (await queue_depths(amqp, topology))["orders.dlq"] == 0

"""What a client may send before the app sees it, checked on the real server (`bandgate
gateway`, uvicorn with `gateway.http_server`'s protocol) over raw sockets: oversized heads
get 431 and leave the gateway's memory where it was, slow heads get 408."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from bandgate.ops.local_broker import free_port

# The HTTP edge (or a CLI over it): the broker matrix leaves it to `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

TOPOLOGY = """
exchange = "bandgate"
[delay]
levels = 4
[queues.orders]
"""


class Gateway:
    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def rss_kib(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1])

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


@pytest.fixture
def gateway(amqp_url: str, tmp_path: Path) -> Iterator[Gateway]:
    topology = tmp_path / "bandgate.toml"
    topology.write_text(TOPOLOGY)
    port = free_port()
    env = {
        **os.environ,
        "BANDGATE_AMQP_URL": amqp_url,
        "BANDGATE_TOPOLOGY": str(topology),
        "BANDGATE_PORT": str(port),
        "BANDGATE_AUTH_ENABLED": "false",
        "BANDGATE_KEEP_ALIVE_SECONDS": "1",
        "BANDGATE_ACCESS_LOG": "false",
    }
    command = [str(Path(sys.executable).parent / "bandgate"), "gateway"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    server = Gateway(process, port)
    try:
        # It starts in seconds; the bound is for a loaded machine, where it starts slower.
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, "the gateway exited"
            assert time.monotonic() < deadline, "the gateway did not become ready"
            try:
                if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()  # never left running: its ResourceWarning would fail a later test
            process.wait()


def send_and_read(sock: socket.socket, *parts: bytes) -> tuple[int, dict[str, Any], int]:
    """Send `parts` while reading the one response on `sock` until the server closes, as a
    client that reads while it writes would: status, JSON body, and the bytes it managed to
    send."""
    received = bytearray()

    def read() -> None:
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    sent = 0
    try:
        for part in parts:
            sock.sendall(part)
            sent += len(part)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the gateway answered and closed: what these tests want
    reader.join(timeout=30)
    sock.close()
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body), sent


def test_a_50_mb_header_gets_431_and_memory_stays_put(gateway: Gateway) -> None:
    for _ in range(20):  # warm up: the first requests allocate what serving needs
        assert httpx.get(f"{gateway.url}/healthz").status_code == 200
    idle = gateway.rss_kib()
    head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: "
    chunks = [b"v" * 65536] * 800  # 50 MiB
    status, body, _ = send_and_read(gateway.connect(), head, *chunks)
    assert status == 431
    assert body == {
        "error": {
            "code": "headers_too_large",
            "message": "the request line and headers exceed 32768 bytes",
            "field": None,
        }
    }
    after = gateway.rss_kib()
    assert after <= idle * 1.1, (idle, after)
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


@pytest.mark.parametrize(("count", "size"), [(101, 8), (100_000, 8), (4, 9000)])
def test_too_many_or_too_large_headers_get_431_and_nothing_is_published(
    gateway: Gateway, count: int, size: int
) -> None:
    body = b'{"payload": 1}'
    head = b"POST /v1/queues/orders/messages HTTP/1.1\r\nhost: x\r\n"
    head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    head += b"".join(b"h%d: %s\r\n" % (i, b"v" * size) for i in range(count))
    status, error, _ = send_and_read(gateway.connect(), head + b"\r\n" + body)
    assert status == 431
    assert error["error"]["code"] == "headers_too_large"
    stats = httpx.get(f"{gateway.url}/v1/queues/orders/stats").json()
    assert stats["dead_lettered"] == 0
    assert all(band["ready"] in (0, None) for band in stats["bands"])


def test_headers_within_the_limits_are_served(gateway: Gateway) -> None:
    headers = {f"h{i}": "v" * 200 for i in range(90)}
    response = httpx.post(
        f"{gateway.url}/v1/queues/orders/messages", json={"payload": 1}, headers=headers
    )
    assert response.status_code == 201, response.text


def test_a_slow_request_head_gets_408(gateway: Gateway) -> None:
    """A client gets the keep-alive timeout (1 s here) to send its head, then 408."""
    started = time.monotonic()
    # The head without its blank line: the server waits for the rest.
    status, body, _ = send_and_read(gateway.connect(), b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
    waited = time.monotonic() - started
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert waited < 5


def test_a_slow_head_after_a_served_request_gets_408(gateway: Gateway) -> None:
    """On a kept-alive connection too: the second request's head gets the same timeout, from
    the read that began it (its timer is armed then, not per request)."""
    sock = gateway.connect()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    first = b""
    while b'"ok"}' not in first:
        first += sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    started = time.monotonic()
    status, body, _ = send_and_read(sock, b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
    assert (status, body["error"]["code"]) == (408, "request_timeout")
    assert time.monotonic() - started < 5

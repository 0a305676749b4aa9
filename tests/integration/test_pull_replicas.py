"""HTTP receivers across gateway processes, as behind a round-robin load balancer: a receipt
settles through any process (`bandgate.pull.mailbox` forwards it to the one holding the lease),
and when the holder is killed its leases come back and its receipts answer 410."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bandgate.ops.local_broker import free_port

pytestmark = pytest.mark.integration

TOPOLOGY = """
exchange = "bandgate"
[delay]
base_ms = 50
levels = 12
[queues.orders]
retry = { max_attempts = 3, backoff_initial_seconds = 0.2, jitter = 0 }
"""


class Gateway:
    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def publish(self, **message: Any) -> str:
        response = self.http.post("/v1/queues/orders/messages", json=message)
        assert response.status_code == 201, response.text
        return str(response.json()["message_id"])

    def receive(self, **asked: Any) -> list[dict[str, Any]]:
        response = self.http.post("/v1/queues/orders/receive", json=asked)
        assert response.status_code == 200, response.text
        messages: list[dict[str, Any]] = response.json()["messages"]
        return messages

    def ack(self, receipt: str) -> httpx.Response:
        return self.http.delete(f"/v1/queues/orders/receipts/{receipt}")


def _start(amqp_url: str, topology: Path) -> Gateway:
    port = free_port()
    env = {
        **os.environ,
        "BANDGATE_AMQP_URL": amqp_url,
        "BANDGATE_TOPOLOGY": str(topology),
        "BANDGATE_PORT": str(port),
        "BANDGATE_AUTH_ENABLED": "false",
        "BANDGATE_ACCESS_LOG": "false",
    }
    command = [str(Path(sys.executable).parent / "bandgate"), "gateway"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
    gateway = Gateway(process, port)
    try:
        # It starts in seconds; the bound is for a loaded machine, where it starts slower.
        deadline = time.monotonic() + 90
        while True:
            assert process.poll() is None, "the gateway exited"
            assert time.monotonic() < deadline, "the gateway did not become ready"
            try:
                if gateway.http.get("/readyz", timeout=2).status_code == 200:
                    return gateway
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    except BaseException:
        _stop(gateway)  # a start that failed leaves no process behind
        raise


def _stop(gateway: Gateway) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 30 s; always reaped."""
    if gateway.process.poll() is None:
        gateway.process.terminate()
        try:
            gateway.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait()
    gateway.http.close()


@pytest.fixture
def gateways(amqp_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, Gateway]]:
    topology = tmp_path / "bandgate.toml"
    topology.write_text(TOPOLOGY)
    started: list[Gateway] = []
    try:
        for _ in range(2):
            started.append(_start(amqp_url, topology))
        yield started[0], started[1]
    finally:
        for gateway in started:
            _stop(gateway)


def test_a_receipt_settles_through_another_process(gateways: tuple[Gateway, Gateway]) -> None:
    one, other = gateways
    acked = one.publish(payload={"n": 1}, priority=8)
    released = one.publish(payload={"n": 2}, priority=8)
    got = {m["message_id"]: m for m in one.receive(max_messages=2, wait_seconds=5)}
    assert set(got) == {acked, released}
    # Extend and release through the other process.
    response = other.http.post(
        "/v1/queues/orders/receipts/extend",
        json={"receipt": got[released]["receipt"], "visibility_timeout": 60},
    )
    assert response.status_code == 200, response.text
    response = other.http.post(
        "/v1/queues/orders/receipts/release", json={"receipt": got[released]["receipt"]}
    )
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "retry"
    # Ack through the other process: gone, never received again.
    assert other.ack(got[acked]["receipt"]).status_code == 204
    again = other.ack(got[acked]["receipt"])
    assert again.status_code == 410
    assert again.json()["error"]["code"] == "lease_expired"
    # An altered receipt is refused by the process that issued it.
    replica, lease, signature = got[acked]["receipt"].split(".")
    forged = other.ack(f"{replica}.{lease}.{signature[::-1]}")
    assert forged.status_code == 422
    assert forged.json()["error"]["code"] == "invalid_receipt"
    seen = [m["message_id"] for m in other.receive(max_messages=10, wait_seconds=3)]
    seen += [m["message_id"] for m in one.receive(max_messages=10, wait_seconds=1)]
    assert seen == [released]  # the retry (attempt 2), and not the acked one


def test_the_leases_of_a_killed_process_come_back(gateways: tuple[Gateway, Gateway]) -> None:
    one, other = gateways
    sent = {one.publish(payload={"n": n}, priority=(8, 5, 1)[n % 3]) for n in range(30)}
    leased: list[dict[str, Any]] = []
    while len(leased) < 20:
        leased += one.receive(max_messages=10, wait_seconds=5, visibility_timeout=600)
    one.process.send_signal(signal.SIGKILL)
    one.process.wait(timeout=10)
    lost = other.ack(leased[0]["receipt"])
    deadline = time.monotonic() + 30
    # Until the broker has removed the killed process's mailbox (RabbitMQ 4.0 was seen to take
    # longer than a forward's timeout), a forward finds no answer: 503 holder_unresponsive, "try
    # again" after Retry-After, as any client is told to.
    while lost.status_code == 503 and time.monotonic() < deadline:
        assert lost.json()["error"]["code"] == "holder_unresponsive", lost.text
        time.sleep(float(lost.headers["Retry-After"]))
        lost = other.ack(leased[0]["receipt"])
    assert lost.status_code == 410, lost.text
    assert lost.json()["error"]["code"] == "lease_lost"
    received: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 30
    while set(received) != sent and time.monotonic() < deadline:
        for message in other.receive(max_messages=10, wait_seconds=2):
            assert message["message_id"] not in received, "received twice from one lease"
            received[message["message_id"]] = message
            assert other.ack(message["receipt"]).status_code == 204
    assert set(received) == sent  # lost: none
    assert other.receive(max_messages=10, wait_seconds=1) == []


def test_a_long_poll_whose_client_left_leases_nothing(gateways: tuple[Gateway, Gateway]) -> None:
    one, _ = gateways
    with pytest.raises(httpx.ReadTimeout):
        one.http.post("/v1/queues/orders/receive", json={"wait_seconds": 20}, timeout=0.5)
    sent = one.publish(payload={}, priority=8)
    started = time.monotonic()
    [message] = one.receive(wait_seconds=5)
    assert message["message_id"] == sent
    assert message["receive_count"] == 1
    assert time.monotonic() - started < 2  # not held by the abandoned poll until it lapsed

"""`examples/http_worker.mjs`, the Node.js worker of docs/guides/consume-http.md, run with node
against a gateway served on a port and a real broker: it handles a backlog hottest band first,
each good order once (a slow one kept leased by extending), retries the failing order until it
dead-letters, dead-letters the poison one at once, and stops on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.conftest import ROOT
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway

NODE = shutil.which("node")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(NODE is None, reason="node is not installed (Debian: apt install nodejs)"),
]

WORKER = ROOT / "examples" / "http_worker.mjs"
BANDS = {"hot": 8, "warm": 5, "cold": 1}
RANK = {band: rank for rank, band in enumerate(BANDS)}
MAX_ATTEMPTS = 3


@pytest.fixture
def topology() -> Topology:
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {
                    "retry": {
                        "max_attempts": MAX_ATTEMPTS,
                        "backoff_initial_seconds": 0.2,
                        "jitter": 0,
                    }
                }
            },
        }
    )


@pytest.fixture
def node() -> str:
    """node, 18 or later (global fetch), or the test is skipped."""
    assert NODE is not None
    version = subprocess.run([NODE, "--version"], capture_output=True, text=True, check=True)
    if int(version.stdout.strip().lstrip("v").split(".")[0]) < 18:
        pytest.skip(f"node {version.stdout.strip()} has no global fetch: the example needs 18+")
    return NODE


@pytest.fixture
def live(broker: TestBroker, amqp_url: str, topology: Topology) -> Iterator[LiveGateway]:
    settings = GatewaySettings(
        amqp_url=amqp_url,
        management_url=broker.management_url,
        host="127.0.0.1",
        port=free_port(),
        auth_enabled=False,
        access_log=False,
        # The worker's last long poll, cut short by its SIGTERM, still runs in the gateway
        # (which does not watch for the client leaving): do not wait the default 10 s for it.
        http_shutdown_grace_seconds=1,
    )
    with LiveGateway(settings, topology) as gateway:
        yield gateway


def orders() -> list[tuple[str, dict[str, Any]]]:
    """20 orders over three bands, interleaved: a slow one, a failing one, a poison one."""
    backlog = []
    for n in range(20):
        band = ("cold", "hot", "warm")[n % 3]
        payload: dict[str, Any] = {"sku": f"sku-{n}", "qty": n + 1}
        if n == 1:
            payload["ms"] = 3500  # longer than the 2 s lease: only extending keeps it ours
        if n == 5:
            payload["fail"] = True
        if n == 9:
            payload["poison"] = True
        backlog.append((band, payload))
    return backlog


async def test_the_node_worker_handles_a_backlog(
    node: str, live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    sent: dict[str, dict[str, Any]] = {}
    async with httpx.AsyncClient(base_url=live.url) as http:
        for band, payload in orders():
            body = {"payload": payload, "priority": BANDS[band]}
            response = await http.post("/v1/queues/orders/messages", json=body)
            assert response.status_code == 201, response.text
            sent[response.json()["message_id"]] = payload
    failing = next(i for i, p in sent.items() if p.get("fail"))
    poison = next(i for i, p in sent.items() if p.get("poison"))
    good = set(sent) - {failing, poison}

    env = {k: v for k, v in os.environ.items() if k != "BANDGATE_TOKEN"}
    env |= {"BANDGATE_GATEWAY_URL": live.url, "QUEUE": "orders", "VISIBILITY_TIMEOUT": "2"}
    env["NODE_NO_WARNINGS"] = "1"  # Node 18 (Debian 12's) calls fetch experimental on stderr
    process = await asyncio.create_subprocess_exec(
        node, str(WORKER), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    assert process.stderr is not None
    lines: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 60

        def finished() -> bool:
            acked = {line["id"] for line in lines if line["action"] == "ack"}
            dead = {line["id"] for line in lines if line["action"] == "dead-lettered"}
            return acked >= good and dead >= {failing, poison}

        while not finished():
            try:
                raw = await asyncio.wait_for(process.stdout.readline(), deadline - time.monotonic())
            except TimeoutError:
                pytest.fail(f"not every message was handled within 60 s: {lines}")
            assert raw, f"the worker exited: {(await process.stderr.read()).decode()}"
            lines.append(json.loads(raw))
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
    rest, errors = await process.stdout.read(), await process.stderr.read()
    assert code == 0, errors.decode()
    assert (rest, errors) == (b"", b"")

    # Every good order once, acked, with its payload; in waterfall order over first attempts.
    handled = Counter(line["id"] for line in lines if line["action"] == "ack")
    assert handled == Counter(good)
    for line in lines:
        assert (line["sku"], line["qty"]) == (sent[line["id"]]["sku"], sent[line["id"]]["qty"])
    first = [RANK[line["band"]] for line in lines if line["attempt"] == 1]
    assert first == sorted(first), [line["band"] for line in lines]
    # The failing order: released on each attempt, dead-lettered by the gateway after the last.
    tries = [(line["attempt"], line["action"]) for line in lines if line["id"] == failing]
    assert tries == [(1, "retry"), (2, "retry"), (MAX_ATTEMPTS, "dead-lettered")]
    assert [line["attempt"] for line in lines if line["id"] == poison] == [1]

    async with httpx.AsyncClient(base_url=live.url) as http:
        letters = (await http.get("/v1/queues/orders/dlq")).json()
        # Acked, not merely leased: the 2 s leases lapse and nothing comes back.
        again = await http.post("/v1/queues/orders/receive", json={"wait_seconds": 3}, timeout=10)
    assert {letter["message_id"]: letter["cause"] for letter in letters["messages"]} == {
        failing: "max-attempts",
        poison: "rejected",
    }
    assert again.json()["messages"] == []
    depths = await queue_depths(amqp, topology)
    assert {name: count for name, count in depths.items() if count} == {"orders.dlq": 2}

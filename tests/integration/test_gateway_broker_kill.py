"""The broker is SIGKILLed under a steady HTTP publish load and restarted: every message
answered 201 is still there afterwards, every other answer was a JSON 503/429, and no message
answered with a "not enqueued" code is there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import httpx
import orjson
import pytest

from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import LocalBroker
from bandgate.topology import naming
from bandgate.topology.model import Topology

pytestmark = [pytest.mark.integration, pytest.mark.fault]

# A quorum queue declared a moment before its node is SIGKILLed may not survive the restart
# (its Ra server was not registered on disk yet); seen to survive when declared 15 s before.
SETTLE_SECONDS = 15
LOAD_WORKERS = 8
# The codes of docs/reference/errors.md for a publish that certainly did not enqueue
# (confirm_timeout and confirm_lost mean the outcome is unknown).
NOT_ENQUEUED = {"broker_unavailable", "broker_blocked", "unroutable", "queue_full"}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path / "node", name="bandgate-kill", plugins=())
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


async def drain(url: str, topology: Topology) -> list[int]:
    """Every message id left in the bands, consumed and acked."""
    seen: list[int] = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for spec in topology.queues.values():
            for band in spec.bands:
                queue = await channel.get_queue(naming.band_queue(spec.name, band.name))
                while (message := await queue.get(fail=False)) is not None:
                    seen.append(orjson.loads(message.body)["n"])
                    await message.ack()
    return seen


async def test_sigkill_under_load_loses_nothing_confirmed(
    node: LocalBroker, topology: Topology
) -> None:
    settings = GatewaySettings(
        amqp_url=node.amqp_url, publish_timeout_seconds=2.0, auth_enabled=False
    )
    app = create_app(settings, topology)
    confirmed: set[int] = set()
    not_enqueued: set[int] = set()
    refused: dict[str, int] = {}
    counter = iter(range(10**9))
    stop = asyncio.Event()
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:

            async def load() -> None:
                while not stop.is_set():
                    n = next(counter)
                    response = await client.post(
                        "/v1/queues/orders/messages", json={"payload": {"n": n}, "priority": n % 10}
                    )
                    if response.status_code == 201:
                        confirmed.add(n)
                    else:
                        assert response.status_code in (429, 503), response.text
                        code = response.json()["error"]["code"]
                        refused[code] = refused.get(code, 0) + 1
                        if code in NOT_ENQUEUED:
                            not_enqueued.add(n)
                        await asyncio.sleep(0.05)

            workers = [asyncio.create_task(load()) for _ in range(LOAD_WORKERS)]
            await asyncio.sleep(SETTLE_SECONDS)
            before_kill = len(confirmed)
            await asyncio.to_thread(node.kill)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(node.start)
            back = time.monotonic()
            mark = len(confirmed)
            while len(confirmed) == mark:
                # How soon it serves again is printed below; this bound only catches a gateway
                # that never does, not a loaded machine.
                assert time.monotonic() - back < 30, "gateway did not serve within 30 s"
                await asyncio.sleep(0.02)
            recovered_in = time.monotonic() - back
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(*workers)

    found = await drain(node.amqp_url, topology)
    lost = confirmed - set(found)
    duplicates = len(found) - len(set(found))
    sent = next(counter)
    print(
        f"\nbroker kill: sent {sent}, answered 201 {len(confirmed)} ({before_kill} before the "
        f"kill), refused {refused}, consumed {len(found)}, lost {len(lost)}, duplicates "
        f"{duplicates}, unconfirmed but present {len(set(found) - confirmed)} (of them answered "
        f"not enqueued: {len(not_enqueued & set(found))}), "
        f"serving again {recovered_in:.2f} s after the broker's return"
    )
    assert before_kill > 0
    assert refused, "the kill should have refused some requests"
    assert not lost
    assert not not_enqueued & set(found), "a message answered 'not enqueued' was enqueued"

"""A consumer the broker gives up on comes back: a handler holds its message past the queue's
consumer timeout (1 s, a `consumer-timeout` policy), the broker returns the message, and the
same worker handles it again and goes on consuming the queue (`ConsumerRunner.lost`).

How the broker gives up depends on the version: 4.3 cancels the consumer (a basic.cancel of its
own, the channel left open), which the worker answers by consuming on a new channel, within a
few seconds; 4.0 closes the channel (PRECONDITION_FAILED), which the robust channel reopens, but
only at the channel's next tick, up to a minute later (seen: 60 s). 3.10 has no per-queue
consumer timeout (only the node-wide `consumer_timeout`), so the test is skipped there.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Awaitable, Callable
from urllib.parse import quote

import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.runner import RESUBSCRIBE_MAX_SECONDS
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology, broker_version, parse_version
from bandgate.topology.loader import parse_topology
from bandgate.topology.management import vhost_of
from bandgate.topology.wire import Envelope, encode
from tests.broker import TestBroker

pytestmark = pytest.mark.integration

TOPOLOGY = parse_topology(
    {
        "delay": {"levels": 2},
        "queues": {"timeouts": {"bands": [{"name": "all", "priorities": [0, 9]}]}},
    }
)
QUEUE = naming.band_queue("timeouts", "all")


def set_consumer_timeout(broker: TestBroker, vhost: str, millis: int) -> None:
    with broker.management() as api:
        api.put(
            f"/api/policies/{quote(vhost, safe='')}/consumer-timeout",
            json={
                "pattern": f"^{QUEUE}$",
                "definition": {"consumer-timeout": millis},
                "apply-to": "queues",
                "priority": 10,
            },
        ).raise_for_status()


async def publish(amqp: AbstractRobustConnection, message_id: str) -> None:
    channel = await amqp.channel()
    envelope = Envelope(queue="timeouts", payload={}, priority=5, message_id=message_id)
    await channel.default_exchange.publish(encode(envelope), routing_key=QUEUE)
    await channel.close()


@pytest.mark.timeout(180)  # 4.0 takes a minute to act on the timeout
async def test_a_consumer_held_past_its_timeout_comes_back(
    broker: TestBroker,
    amqp_url: str,
    amqp: AbstractRobustConnection,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    version = parse_version(broker_version(amqp))
    if version < (4, 0):
        pytest.skip(
            f"RabbitMQ {broker_version(amqp)} has no per-queue consumer timeout to set (the "
            "consumer-timeout policy key), only the node-wide consumer_timeout"
        )
    await apply_topology(amqp, TOPOLOGY)
    await asyncio.to_thread(set_consumer_timeout, broker, vhost_of(amqp_url), 1000)
    app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=TOPOLOGY)
    handled: list[str] = []
    held, release, again, second = (asyncio.Event() for _ in range(4))

    @app.consumer("timeouts", concurrency=2)
    async def handle(msg: Message) -> None:
        handled.append(msg.message_id)
        if msg.message_id == "second":
            second.set()
        elif not held.is_set():
            held.set()
            await release.wait()  # far past the 1 s timeout: until the test is done with it
        else:
            again.set()

    caplog.set_level(logging.INFO)
    worker = await start_worker(app)
    await publish(amqp, "first")
    await asyncio.wait_for(held.wait(), 10)
    # The broker returns it after the timeout, and the worker, consuming again, gets it again.
    await asyncio.wait_for(again.wait(), 30 if version >= (4, 3) else 100)
    await publish(amqp, "second")
    await asyncio.wait_for(second.wait(), 10)
    release.set()
    await asyncio.wait(worker.runners[0].in_flight, timeout=10)
    assert handled == ["first", "first", "second"]

    channel = await amqp.channel()
    queue = await channel.declare_queue(QUEUE, passive=True)
    assert queue.declaration_result.message_count == 0
    await channel.close()
    # The held run's ack went nowhere: its channel was gone, and the message was acked after its
    # second run.
    assert any("could not ack message first" in r.getMessage() for r in caplog.records)
    cancelled = [
        r
        for r in caplog.records
        if r.name == "bandgate.consumers.runner" and "again" in r.getMessage()
    ]
    if version >= (4, 3):  # a basic.cancel: the worker consumed again on a new channel
        assert cancelled[0].getMessage().startswith(f"{QUEUE}: the broker cancelled its consumer")
        assert cancelled[0].levelno == logging.WARNING
        assert f"consuming {QUEUE} again" in cancelled[-1].getMessage()
    else:  # 4.0 closed the channel: the robust channel reopened and consumed again
        assert cancelled == []


async def test_a_worker_consumes_a_deleted_queue_again_once_it_is_back(
    amqp_url: str,
    amqp: AbstractRobustConnection,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Deleting a queue cancels its consumers (every version): the worker tries again, backing
    off while the queue is gone, and consumes it once it is declared again."""
    await apply_topology(amqp, TOPOLOGY)
    settings = WorkerSettings(amqp_url=amqp_url, reconnect_interval_seconds=0.1)
    app = ConsumerApp(settings, topology=TOPOLOGY)
    handled = asyncio.Event()

    @app.consumer("timeouts")
    async def handle(msg: Message) -> None:
        handled.set()

    caplog.set_level(logging.INFO)
    await start_worker(app)
    channel = await amqp.channel()
    await channel.queue_delete(QUEUE)
    await channel.close()

    def resubscribing() -> list[str]:
        # Only this module's records: some of aio-pika's cannot be formatted (a repr that raises).
        return [r.getMessage() for r in caplog.records if r.name == "bandgate.consumers.runner"]

    def failed_tries() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.name == "bandgate.consumers.runner"
            and r.getMessage().startswith(f"cannot consume {QUEUE}")
        ]

    def retries() -> list[str]:
        return [r.getMessage() for r in failed_tries()]

    deadline = asyncio.get_running_loop().time() + 10
    while len(retries()) < 3:  # tried, waited 0.1 s, tried, waited 0.2 s, tried
        assert asyncio.get_running_loop().time() < deadline, resubscribing()
        await asyncio.sleep(0.05)
    gone_for = asyncio.get_running_loop().time() - deadline + 10
    await apply_topology(amqp, TOPOLOGY)
    await publish(amqp, "after")
    await asyncio.wait_for(handled.wait(), 15)
    # Backing off: the waits double (0.1, 0.2, 0.4 s ...), no tight loop while it was gone.
    # How many tries that makes depends on how fast the queue came back (a loaded machine is
    # slower), so each wait is checked instead: as announced, and no try came sooner.
    assert gone_for >= 0.3
    tries = failed_tries()
    announced = [
        float(re.findall(r"trying again in ([\d.e+-]+) s", r.getMessage())[0]) for r in tries
    ]
    assert announced == [min(0.1 * 2**k, RESUBSCRIBE_MAX_SECONDS) for k in range(len(tries))]
    gaps = [later.created - earlier.created for earlier, later in itertools.pairwise(tries)]
    assert all(gap >= wait - 0.01 for gap, wait in zip(gaps, announced, strict=False)), gaps
    assert resubscribing()[-1] == f"consuming {QUEUE} again"

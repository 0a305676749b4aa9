"""The in-memory harness (`bandgate.testing`): its broker model (routing from the topology's own
objects, the delay ladder and aging on the test's clock, priority order in classic bands,
returns counted), its stand-ins held to the aio-pika and aiormq names they stand in for, and
flows the worker decides: a crash loop dead-lettered, replace and escalate, dedupe, a handler
that hangs. tests/integration/test_harness_parity.py compares it with a real broker."""

from __future__ import annotations

import ast
import asyncio
import inspect
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pytest

from bandgate.consumers import Ack, ConsumerApp, Message, Requeue, Tombstoned
from bandgate.core.publish_outcomes import InvalidMessage, UnknownQueue
from bandgate.core.publishing import Publisher
from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.testing import Harness, MemoryBroker
from bandgate.testing.memory_broker import (
    READS_NOT_MODELLED,
    MemoryAcks,
    MemoryChannel,
    MemoryChannels,
    MemoryConnection,
    _topic,
)
from bandgate.topology import naming, wire
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope

TOPOLOGY = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 12},
        "queues": {
            "orders": {
                "retry": {"max_attempts": 3, "max_deliveries": 3, "backoff_initial_seconds": 1},
                "bands": [
                    {"name": "hot", "priorities": [7, 9]},
                    {"name": "warm", "priorities": [4, 6], "age_after_seconds": 600},
                    {"name": "cold", "priorities": [0, 3], "type": "classic"},
                ],
            },
        },
    }
)


def ready(broker: MemoryBroker, name: str) -> list[Any]:
    return [wire.decode_body(stored.body) for stored in broker.queues[name].messages()]


async def publish(broker: MemoryBroker, queue: str, payload: object, **fields: object) -> None:
    publisher = Publisher(broker.topology, MemoryChannels(broker))
    envelope = Envelope(queue=queue, payload=payload, **fields)  # type: ignore[arg-type]
    await publisher.publish(envelope)


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("orders.7", "orders.7", True),
        ("*.1.#", "0.1.orders.7", True),
        ("*.1.#", "1.0.orders.7", False),
        ("#.orders.7", "0.0.orders.7", True),
        ("#.orders.7", "orders.7", True),
        ("#.orders.7", "x.orders.8", False),
    ],
)
def test_topic_patterns_match_as_amqp_says(pattern: str, key: str, matches: bool) -> None:
    assert _topic(pattern.split("."), key.split(".")) is matches


async def test_every_priority_lands_in_its_band_through_the_declared_bindings() -> None:
    broker = MemoryBroker(TOPOLOGY)
    spec = TOPOLOGY.queue("orders")
    for priority in range(10):
        await publish(broker, "orders", priority, priority=priority)
    for band in spec.bands:
        held = sorted(ready(broker, naming.band_queue("orders", band.name)))
        assert held == list(range(band.low, band.high + 1)), band.name


async def test_a_delay_runs_down_the_ladder_on_the_test_clock() -> None:
    broker = MemoryBroker(TOPOLOGY)
    await publish(
        broker, "orders", "later", priority=8, deliver_at=wire.now() + timedelta(seconds=1.3)
    )
    hot = naming.band_queue("orders", "hot")
    assert broker.next_expiry() is not None
    while (due := broker.next_expiry()) is not None and due < 1.2:
        broker.clock.now = due
        broker.expire()
    assert ready(broker, hot) == []
    broker.clock.now = 1.3
    broker.expire()
    assert ready(broker, hot) == ["later"]
    [stored] = broker.queues[hot].messages()
    headers: dict[str, Any] = dict(stored.properties.headers or {})
    assert headers["x-death"][0]["reason"] == "expired"


async def test_a_waiting_warm_message_is_promoted_after_its_age() -> None:
    broker = MemoryBroker(TOPOLOGY)
    await publish(broker, "orders", "old", priority=5)
    broker.clock.now = 599
    broker.expire()
    assert ready(broker, naming.band_queue("orders", "warm")) == ["old"]
    broker.clock.now = 600
    broker.expire()
    assert ready(broker, naming.band_queue("orders", "hot")) == ["old"]


async def test_a_classic_band_holds_its_messages_by_priority() -> None:
    broker = MemoryBroker(TOPOLOGY)
    for priority in (1, 3, 0, 3, 2):
        await publish(broker, "orders", f"p{priority}", priority=priority)
    assert ready(broker, naming.band_queue("orders", "cold")) == ["p3", "p3", "p2", "p1", "p0"]


async def test_a_return_keeps_its_place_and_is_counted_on_a_quorum_queue() -> None:
    broker = MemoryBroker(TOPOLOGY)
    for name in ("a", "b"):
        await publish(broker, "orders", name, priority=8)
    channel = MemoryChannel(broker, 1)
    tags: list[int] = []

    async def take(delivered: aiormq.abc.DeliveredMessage) -> None:
        assert delivered.delivery_tag is not None
        tags.append(delivered.delivery_tag)

    await channel.set_qos(prefetch_count=1)
    await channel.basic_consume(naming.band_queue("orders", "hot"), take)
    await broker.delivered()
    assert tags == [1]
    await channel.basic_reject(1, requeue=True)
    await channel.close()
    [first, _] = broker.queues[naming.band_queue("orders", "hot")].messages()
    assert wire.decode_body(first.body) == "a"
    assert (first.properties.headers or {})[wire.DELIVERY_COUNT] == 1
    assert first.redelivered


def test_the_stand_ins_are_named_as_aio_pika_and_aiormq_name_them() -> None:
    """What bandgate calls of a connection and its channels, where the stand-ins stand in."""
    channel_methods = ["queue_declare", "basic_consume", "basic_cancel", "basic_ack"]
    for name in [*channel_methods, "basic_nack", "basic_reject", "is_closed"]:
        assert hasattr(aiormq.Channel, name), name
        assert hasattr(MemoryChannel, name), name
    assert "on_consumer_cancel_callbacks" in inspect.getsource(aiormq.Channel.__init__)
    for name in ["set_qos", "get_underlay_channel", "close", "is_closed"]:
        assert hasattr(aio_pika.Channel, name), name
        assert hasattr(MemoryChannel, name), name
    assert "close_callbacks" in inspect.getsource(aio_pika.Channel.__init__)
    for name in ["channel", "close", "is_closed"]:
        assert hasattr(aio_pika.Connection, name), name
        assert hasattr(MemoryConnection, name), name
    ack = inspect.signature(MemoryAcks.ack)
    assert list(ack.parameters) == ["self", "channel", "delivery_tag", "unsettled"]


def app_of(topology: Topology = TOPOLOGY, **options: object) -> tuple[ConsumerApp, list[Message]]:
    app = ConsumerApp(topology=topology)
    seen: list[Message] = []

    @app.consumer("orders", **options)  # type: ignore[arg-type]
    async def handle(msg: Message) -> None:
        seen.append(msg)
        if msg.payload == "crash":
            raise Requeue("a worker died on it")
        if msg.payload == "hang":
            await asyncio.sleep(60)

    return app, seen


async def test_a_message_workers_keep_dying_on_is_dead_lettered_before_it_runs_again() -> None:
    app, seen = app_of()
    async with Harness(app) as harness:
        await harness.publish("orders", "crash", message_id="m")
        await harness.drain()
    assert [msg.delivery_count for msg in seen] == [0, 1, 2]  # max_deliveries 3
    [dead] = harness.dead_letters("orders")
    assert dead.cause == "delivery-limit"


async def test_replace_supersedes_and_escalate_moves_to_a_hotter_band() -> None:
    app, seen = app_of()
    async with Harness(app) as harness:
        await harness.publish("orders", "v1", message_id="m", priority=1, delay=10)
        await harness.publish("orders", "old", message_id="n", priority=1, delay=10)
        await harness.replace("orders", "m", "v2", priority=1, delay=5)
        await harness.escalate("orders", "n", "urgent", priority="critical")
        await harness.join()
    assert [(msg.payload, msg.band) for msg in seen] == [("urgent", "hot"), ("v2", "cold")]
    assert harness.outcomes("m") == [Ack(), Tombstoned("superseded")]
    assert harness.outcomes("n") == [Ack(), Tombstoned("superseded")]


async def test_a_consumer_that_dedupes_runs_an_id_once() -> None:
    app, seen = app_of(dedupe=True)
    async with Harness(app) as harness:
        await harness.publish("orders", "once", message_id="m")
        await harness.drain()
        await harness.publish("orders", "once", message_id="m")
        await harness.drain()
    assert len(seen) == 1
    assert harness.outcomes("m") == [Ack(), Tombstoned("duplicate")]


async def test_the_producer_s_input_rules_apply() -> None:
    app, _ = app_of()
    async with Harness(app) as harness:
        with pytest.raises(UnknownQueue):
            await harness.publish("nowhere", 1)


async def test_drain_says_when_a_handler_hangs() -> None:
    app, _ = app_of()
    async with Harness(app) as harness:
        await harness.publish("orders", "hang")
        with pytest.raises(TimeoutError, match="still busy"):
            await harness.drain(within=0.2)


def test_the_example_worker_s_tests_use_only_the_harness() -> None:
    """examples/test_worker.py (shown in docs/guides/testing.md, run by `pytest examples`):
    the README's worker tested through the harness alone, one test per flow the guide names."""
    path = Path(__file__).resolve().parents[2] / "examples" / "test_worker.py"
    tree = ast.parse(path.read_text())
    imported = {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert {name for name in imported if name.startswith("bandgate")} == {
        "bandgate.consumers",
        "bandgate.testing",
    }
    assert not {name for name in imported if name.split(".")[0] in {"aio_pika", "aiormq"}}
    tests = {node.name for node in tree.body if isinstance(node, ast.AsyncFunctionDef)}
    for flow in ("hot_orders_run_before", "recount", "dead_lettered", "cancelled", "one_at_a_time"):
        assert any(flow in name for name in tests), flow


async def test_the_gateway_app_serves_its_http_api_into_the_harness() -> None:
    """Through Starlette's `TestClient`, which runs the app on a thread and loop of its own."""
    with warnings.catch_warnings():  # this starlette asks for httpx2, which is not installed
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    app, seen = app_of()
    async with Harness(app) as harness:
        gateway = create_app(GatewaySettings(auth_enabled=False), link=harness.gateway_link())
        with TestClient(gateway) as client:
            sent = client.post(
                "/v1/queues/orders/messages", json={"payload": "now", "priority": "high"}
            )
            assert (sent.status_code, sent.json()["band"]) == (201, "hot")
            later = {"payload": "later", "delay_seconds": 5, "message_id": "c"}
            assert client.post("/v1/queues/orders/messages", json=later).status_code == 201
            assert client.delete("/v1/queues/orders/messages/c").status_code == 202
            unknown = client.post("/v1/queues/nowhere/messages", json={"payload": 1})
            assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "unknown_queue")
            assert client.post("/v1/queues/orders/messages", json={}).status_code == 422
            ready = client.get("/readyz")
            assert (ready.status_code, ready.json()["broker_version"]) == (
                200,
                f"in-memory, as RabbitMQ {MemoryBroker.version}",
            )
            for read in ("/v1/queues/orders/stats", "/v1/queues/orders/dlq"):  # not modelled
                answer = client.get(read)
                assert (answer.status_code, answer.json()["error"]["code"]) == (
                    503,
                    "broker_unavailable",
                ), read
                assert answer.json()["error"]["message"] == READS_NOT_MODELLED
            assert client.get("/v1/console/overview").status_code == 200
        await harness.join()
    assert [msg.payload for msg in seen] == ["now"]
    assert harness.outcomes("c") == [Tombstoned("cancelled")]


ORDERED = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 12},
        "queues": {
            "orders": {
                "ordered": True,
                "retry": {"max_attempts": 2, "backoff_initial_seconds": 0.05, "jitter": 0},
            }
        },
    }
)


async def test_an_ordered_queue_retries_in_place_and_holds_the_key_meanwhile() -> None:
    """Its back-off is the worker's own wait, in real time: the key's next message waits."""
    app = ConsumerApp(topology=ORDERED)
    runs: list[tuple[str, int]] = []

    @app.consumer("orders", concurrency=4)
    async def handle(msg: Message) -> None:
        runs.append((msg.payload, msg.attempt))
        if msg.payload == "bad":
            raise ValueError("no")

    async with Harness(app) as harness:
        for payload in ("bad", "next"):
            await harness.publish("orders", payload, partition_key="k", message_id=payload)
        await harness.drain()
    assert runs == [("bad", 1), ("bad", 2), ("next", 1)]
    [dead] = harness.dead_letters("orders")
    assert (dead.message_id, dead.cause) == ("bad", "max-attempts")


async def test_a_sync_handler_runs_in_the_worker_s_threads() -> None:
    """The example's e-mails: a plain function on a weighted queue, its cold band classic."""
    from examples import worker

    async with Harness(worker.app) as harness:
        await harness.publish("emails", {"to": "a@example.com"}, priority=1)
        await harness.publish("emails", {"subject": "no recipient"}, priority=8)
        await harness.drain()
    assert sorted(type(s.outcome).__name__ for s in harness.settled) == ["Ack", "DeadLetter"]
    [dead] = harness.dead_letters("emails")
    assert dead.reason == "Reject: an e-mail needs a recipient"


async def test_a_cancel_s_id_follows_the_rule_a_published_id_does() -> None:
    """`Producer.cancel` refuses an id the gateway's `DELETE .../messages/{id}` refuses (and
    a publish's `message_id`), with the same field, and writes no tombstone for it."""
    app, _ = app_of()
    async with Harness(app) as harness:
        for bad in ("", "x" * 300):
            with pytest.raises(InvalidMessage) as refused:
                await harness.cancel("orders", bad)
            assert refused.value.field == "message_id"

"""The Python producer against a real broker: the message the gateway would have written, in
the same band; delays; the typed failures, with nothing sent for a refused message; batches;
the sync wrapper from other threads; and the docs' examples (docs/guides/publish-python.md),
run as written."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate import (
    BatchMessage,
    BrokerRejected,
    BrokerUnavailable,
    InvalidMessage,
    MessageTooLarge,
    NotEnqueued,
    Producer,
    Published,
    SyncProducer,
    TopologyMissing,
    UnknownQueue,
    Unroutable,
)
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "message_id",
    "correlation_id",
    "reply_to",
    "expiration",
    "type",
    "user_id",
    "app_id",
)
# What differs between two publishes of one input: when each was made.
TIMES = (wire.ENQUEUED_AT, wire.DELIVER_AT)


@pytest.fixture
async def producer(amqp_url: str, topology: Topology) -> AsyncIterator[Producer]:
    async with Producer.connect(amqp_url, topology=topology, declare_topology=True) as producer:
        yield producer


async def get_all(
    connection: AbstractRobustConnection, queue: str
) -> list[AbstractIncomingMessage]:
    channel = await connection.channel()
    target = await channel.declare_queue(queue, passive=True)
    messages = []
    while (message := await target.get(no_ack=True, fail=False)) is not None:
        messages.append(message)
    await channel.close()
    return messages


async def next_message(connection: AbstractRobustConnection, queue: str) -> AbstractIncomingMessage:
    """The next message `queue` delivers, awaited as it arrives."""
    channel = await connection.channel()
    arrived: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()

    async def on_message(message: AbstractIncomingMessage) -> None:
        await message.ack()
        if not arrived.done():
            arrived.set_result(message)

    target = await channel.declare_queue(queue, passive=True)
    await target.consume(on_message)
    try:
        async with asyncio.timeout(10):
            return await arrived
    finally:
        await channel.close()


def amqp_view(message: AbstractIncomingMessage) -> dict[str, Any]:
    """A message as the broker holds it, without the times of its publish."""
    headers = {k: v for k, v in (message.headers or {}).items() if k not in TIMES}
    view = {name: getattr(message, name) for name in PROPERTIES}
    return view | {"headers": headers, "body": message.body, "timestamp": bool(message.timestamp)}


@pytest.mark.parametrize(
    ("extra", "queue"),
    [
        ({"priority": "high"}, "orders.hot"),
        ({"priority": 5, "partition_key": "customer-7"}, "orders.warm"),
        ({}, "orders.warm"),
        ({"priority": "background"}, "orders.cold"),
    ],
)
async def test_the_producer_writes_the_message_the_gateway_writes(
    client: httpx.AsyncClient,
    producer: Producer,
    amqp: AbstractRobustConnection,
    extra: dict[str, Any],
    queue: str,
) -> None:
    fields = {"message_id": "order-42", "headers": {"tenant": "acme", "n": 3}} | extra
    payload = {"order": 42, "lines": [1, 2.5, None]}
    response = await client.post("/v1/queues/orders/messages", json={"payload": payload, **fields})
    assert response.status_code == 201, response.text
    published = await producer.publish("orders", payload, **fields)
    http = response.json()
    assert isinstance(published, Published)
    for name in ("message_id", "queue", "priority", "band"):
        assert http[name] == getattr(published, name), name
    assert http["deliver_at"] is published.deliver_at is None
    from_gateway, from_producer = await get_all(amqp, queue)
    assert amqp_view(from_producer) == amqp_view(from_gateway)
    assert from_producer.priority == published.priority
    assert from_producer.headers[wire.ENQUEUED_AT] == wire.to_millis(published.enqueued_at)


@pytest.mark.parametrize(
    ("priority", "band", "expected"),
    [
        (9, "hot", 9),
        ("critical", "hot", 9),
        ("HIGH", "hot", 7),
        ("normal", "warm", 4),
        (None, "warm", 4),
        ("low", "cold", 2),
        ("background", "cold", 0),
        ("3", "cold", 3),
    ],
)
async def test_priorities_and_their_names_land_in_their_bands(
    producer: Producer,
    amqp: AbstractRobustConnection,
    priority: int | str | None,
    band: str,
    expected: int,
) -> None:
    published = await producer.publish("orders", "p", priority=priority)
    assert (published.band, published.priority) == (band, expected)
    (message,) = await get_all(amqp, naming.band_queue("orders", band))
    assert message.priority == expected
    assert message.message_id == published.message_id


async def test_a_delayed_message_waits_in_the_ladder_then_lands_in_its_band(
    producer: Producer, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    started = time.monotonic()
    published = await producer.publish("orders", {"later": True}, priority=8, delay=1.0)
    assert published.deliver_at == published.enqueued_at + timedelta(seconds=1)
    depths = await queue_depths(amqp, topology)
    assert depths["orders.hot"] == 0
    assert sum(depths.values()) == 1  # in a delay level
    message = await next_message(amqp, "orders.hot")
    assert time.monotonic() - started >= 0.9
    assert message.message_id == published.message_id
    assert message.headers[wire.DELIVER_AT] == wire.to_millis(published.deliver_at)
    assert "x-death" in message.headers  # came through the ladder


async def test_deliver_at_holds_a_message_until_then(
    producer: Producer, amqp: AbstractRobustConnection
) -> None:
    due = datetime.now(UTC) + timedelta(seconds=1)
    published = await producer.publish("orders", 1, priority="low", deliver_at=due)
    assert published.deliver_at == due
    message = await next_message(amqp, "orders.cold")
    assert datetime.now(UTC) >= due - timedelta(milliseconds=100)
    assert message.message_id == published.message_id


async def test_refused_input_raises_its_typed_error_and_sends_nothing(
    producer: Producer, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    refusals: list[tuple[dict[str, Any], str, str | None]] = [
        ({"queue": "nope"}, "unknown_queue", "queue"),
        ({"priority": 10}, "invalid_priority", "priority"),
        ({"priority": "urgent"}, "invalid_priority", "priority"),
        ({"delay": -1}, "invalid_field", "delay"),
        ({"delay": 1, "deliver_at": datetime.now(UTC)}, "conflicting_fields", "deliver_at"),
        ({"deliver_at": datetime(2030, 1, 1)}, "invalid_field", "deliver_at"),
        ({"headers": {"x-bandgate-attempt": 9}}, "invalid_field", "headers"),
        ({"message_id": "a\nb"}, "invalid_field", "message_id"),
        # What no JSON body holds: the gateway answers such a body malformed_json.
        ({"payload": object()}, "malformed_json", "payload"),
        ({"payload": 2**64}, "malformed_json", "payload"),
        ({"headers": {f"h{i}": "v" * 4096 for i in range(32)}}, "message_too_large", "headers"),
    ]
    for given, code, field in refusals:
        arguments: dict[str, Any] = {"queue": "orders", "payload": 1} | given
        with pytest.raises(InvalidMessage) as caught:
            await producer.publish(arguments.pop("queue"), arguments.pop("payload"), **arguments)
        assert (caught.value.code, caught.value.field) == (code, field), given
        assert isinstance(caught.value, NotEnqueued)
    with pytest.raises(UnknownQueue):
        await producer.publish("nope", 1)
    with pytest.raises(MessageTooLarge):
        await producer.publish("orders", 1, headers={f"h{i}": "v" * 4096 for i in range(32)})
    assert sum((await queue_depths(amqp, topology)).values()) == 0
    # The connection survived every refusal.
    assert isinstance(await producer.publish("orders", 1), Published)


# (id, payload, headers, the HTTP body a client would send for them)
NOT_FOR_THE_GATEWAY: list[tuple[str, Any, dict[str, Any] | None, bytes]] = [
    ("NaN header", 1, {"a": float("nan")}, b'{"payload":1,"headers":{"a":NaN}}'),
    ("inf header", 1, {"a": float("inf")}, b'{"payload":1,"headers":{"a":1e999}}'),
    ("-inf header", 1, {"a": -float("inf")}, b'{"payload":1,"headers":{"a":-1e999}}'),
    ("NaN payload", float("nan"), None, b'{"payload":NaN}'),
    ("inf payload", {"v": [float("inf")]}, None, b'{"payload":{"v":[1e999]}}'),
    ("datetime payload", datetime(2030, 1, 1, tzinfo=UTC), None,
     b'{"payload":2030-01-01T00:00:00+00:00}'),
    ("oversized payload", "x" * (64 * 1024), None,
     b'{"payload":"' + b"x" * (64 * 1024) + b'"}'),
]  # fmt: skip


async def test_what_the_gateway_refuses_the_producer_refuses_and_its_connection_stays_up(
    client: httpx.AsyncClient,
    amqp_url: str,
    amqp: AbstractRobustConnection,
    topology: Topology,
) -> None:
    """Issue 33, finding 4: a NaN header made RabbitMQ close the producer's connection (541),
    failing every publish in flight on it. Each input is refused with the gateway's code for
    the same body, nothing reaches the broker, and a publish sent alongside them succeeds on
    the connection that was never closed."""
    async with Producer.connect(
        amqp_url, topology=topology, declare_topology=True, max_body_bytes=64 * 1024
    ) as producer:
        closed: list[object] = []
        producer.connection.close_callbacks.add(lambda *args: closed.append(args))
        producer.connection.reconnect_callbacks.add(lambda *args: closed.append(args))
        for name, payload, headers, body in NOT_FOR_THE_GATEWAY:
            response = await client.post(
                "/v1/queues/orders/messages",
                content=body,
                headers={"content-type": "application/json"},
            )
            assert response.status_code in {400, 413}, name
            code = response.json()["error"]["code"]
            good, refused = await asyncio.gather(
                producer.publish("orders", {"alongside": name}),
                producer.publish("orders", payload, headers=headers),
                return_exceptions=True,
            )
            assert isinstance(refused, InvalidMessage), name
            assert refused.code == code, name
            assert isinstance(good, Published), (name, good)
        batch = await producer.publish_batch(
            "orders", [{"payload": p, "headers": h} for _, p, h, _ in NOT_FOR_THE_GATEWAY]
        )
        assert [f.code for _, f in batch.failed] == ["malformed_json"] * 6 + ["body_too_large"]
        assert isinstance(await producer.publish("orders", "after"), Published)
        assert closed == []
        assert not producer.connection.is_closed

    def sync_publishes() -> Published:
        with SyncProducer.connect(amqp_url, topology=topology) as sync:
            with pytest.raises(InvalidMessage) as caught:
                sync.publish("orders", 1, headers={"a": float("nan")})
            assert caught.value.code == "malformed_json"
            return sync.publish("orders", "after, from a thread")

    assert isinstance(await asyncio.to_thread(sync_publishes), Published)
    depths = await queue_depths(amqp, topology)
    assert depths["orders.warm"] == len(NOT_FOR_THE_GATEWAY) + 2
    assert sum(depths.values()) == len(NOT_FOR_THE_GATEWAY) + 2


async def test_an_unroutable_message_raises_and_a_missing_exchange_is_topology_missing(
    amqp_url: str, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await apply_topology(amqp, topology)
    channel = await amqp.channel()
    await channel.exchange_delete(topology.exchange)  # the bands stay, their bindings go
    await channel.declare_exchange(topology.exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    async with Producer.connect(amqp_url, topology=topology) as producer:
        with pytest.raises(Unroutable, match="no binding"):
            await producer.publish("orders", 1, priority=9)
        result = await producer.publish_batch("orders", [{"payload": 1}, {"payload": 2}])
        assert [failure.code for _, failure in result.failed] == ["unroutable"] * 2
        await channel.exchange_delete(topology.exchange)
        with pytest.raises(TopologyMissing):
            await producer.publish("orders", 1)
    assert sum((await queue_depths(amqp, topology)).values()) == 0


async def test_a_full_band_is_broker_rejected(amqp_url: str) -> None:
    small = parse_topology(
        {
            "delay": {"levels": 4},
            "queues": {
                "orders": {
                    "bands": [
                        {"name": "hot", "priorities": [7, 9], "max_length": 1, "type": "classic"},
                        {"name": "cold", "priorities": [0, 6]},
                    ]
                }
            },
        }
    )
    async with Producer.connect(amqp_url, topology=small, declare_topology=True) as producer:
        await producer.publish("orders", 1, priority=9)
        with pytest.raises(BrokerRejected) as caught:
            await producer.publish("orders", 2, priority=9)
        assert caught.value.code == "queue_full"
        assert isinstance(await producer.publish("orders", 3, priority=1), Published)


async def test_a_batch_reports_each_message_and_enqueues_only_the_good_ones(
    producer: Producer, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    messages = cast(
        list[BatchMessage],
        [
            {"payload": 1, "priority": 9, "message_id": "a"},
            {"payload": 2, "priority": 10},
            {"payload": 3, "priority": "low", "headers": {"tenant": "acme"}},
            {"priority": 1},
            {"payload": 5, "priority": 9, "message_id": "a"},
            {"payload": 6, "delay": 1},
        ],
    )
    result = await producer.publish_batch("orders", messages)
    assert len(result.outcomes) == 6
    assert [(index, published.band) for index, published in result.successful] == [
        (0, "hot"),
        (2, "cold"),
        (5, "warm"),
    ]
    failed = {index: failure for index, failure in result.failed}
    assert {index: failure.code for index, failure in failed.items()} == {
        1: "invalid_priority",
        3: "missing_field",
        4: "duplicate_message_id",
    }
    assert all(isinstance(failure, NotEnqueued) for failure in failed.values())
    depths = await queue_depths(amqp, topology)
    assert (depths["orders.hot"], depths["orders.cold"], depths["orders.warm"]) == (1, 1, 0)
    assert sum(depths.values()) == 3  # the delayed one waits in the ladder
    (cold,) = await get_all(amqp, "orders.cold")
    assert cold.headers["tenant"] == "acme"


async def test_the_sync_producer_from_a_plain_thread(
    amqp_url: str, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    def publish() -> Published:
        with SyncProducer.connect(amqp_url, topology=topology, declare_topology=True) as sync:
            with pytest.raises(UnknownQueue):
                sync.publish("nope", 1)
            result = sync.publish_batch("orders", [{"payload": 1, "priority": "critical"}])
            assert [published.band for _, published in result.successful] == ["hot"]
            return sync.publish("orders", {"n": 1}, priority="high", headers={"k": "v"})

    published = await asyncio.to_thread(publish)
    assert (published.band, published.priority) == ("hot", 7)
    hot = await get_all(amqp, "orders.hot")
    assert [message.priority for message in hot] == [9, 7]
    assert hot[1].message_id == published.message_id
    assert hot[1].headers["k"] == "v"


async def test_one_sync_producer_shared_by_two_threads(
    amqp_url: str, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    sync = await asyncio.to_thread(
        SyncProducer.connect, amqp_url, topology=topology, declare_topology=True
    )

    def work(name: str) -> list[str]:
        ids = [sync.publish("orders", {"from": name, "n": n}, priority=n % 10).message_id
               for n in range(20)]  # fmt: skip
        batch = sync.publish_batch("orders", [{"payload": n, "priority": 9} for n in range(10)])
        return ids + [published.message_id for _, published in batch.successful]

    try:
        first, second = await asyncio.gather(
            asyncio.to_thread(work, "first"), asyncio.to_thread(work, "second")
        )
    finally:
        await asyncio.to_thread(sync.close)
    assert len(first) == len(second) == 30
    assert len(set(first) | set(second)) == 60
    depths = await queue_depths(amqp, topology)
    assert sum(depths.values()) == 60
    with pytest.raises(BrokerUnavailable, match="closed"):
        sync.publish("orders", 1)


def docs_examples() -> list[str]:
    """The Python code blocks of the docs' "Publish from Python" page."""
    page = (ROOT / "docs" / "guides" / "publish-python.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)


async def test_the_docs_producer_examples_run(
    amqp_url: str,
    amqp: AbstractRobustConnection,
    topology: Topology,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    examples = docs_examples()
    assert len(examples) == 2
    # The examples read the topology as deployments do: the file BANDGATE_TOPOLOGY names.
    toml = tmp_path / "bandgate.toml"
    toml.write_text('exchange = "bandgate"\n[delay]\nlevels = 12\n[queues.orders]\n')
    monkeypatch.setenv("BANDGATE_TOPOLOGY", str(toml))
    # ...and the broker as the gateway and the workers pick it: no URL in the code.
    monkeypatch.setenv("BANDGATE_AMQP_URL", amqp_url)
    await apply_topology(amqp, topology)
    for code in examples:
        assert "amqp://" not in code
        program = compile(code, "docs/guides/publish-python.md", "exec")
        # In a thread of its own: the async example runs its own event loop.
        await asyncio.to_thread(exec, program, {"__name__": "readme_example"})
    depths = await queue_depths(amqp, topology)
    assert depths["orders.hot"] == 2  # the batch's critical message, and the sync example's
    assert sum(depths.values()) == 3  # and the delayed one, in the ladder
    hot = await get_all(amqp, "orders.hot")
    assert [message.message_id for message in hot][1] == "order-4"
    assert hot[1].headers[wire.PARTITION_KEY] == "customer-7"

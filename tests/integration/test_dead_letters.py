"""Dead-letter tooling: reading a dead letter, and list, replay and purge on a real broker.

Dead letters are made the way a worker makes them: `consumers.settlement.dead_letter_message`
published through the dead-letter exchange with confirms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from typer.testing import CliRunner

from bandgate.consumers.decision import DeadLetter as DeadLetterOutcome
from bandgate.consumers.decision import DeadLetterCause
from bandgate.consumers.message import Message
from bandgate.consumers.settlement import dead_letter_message
from bandgate.core.dead_letter_records import (
    REPLAYS,
    DeadLetter,
    matches,
    read_dead_letter,
    replay_envelope,
    replay_priority,
)
from bandgate.core.dead_letters import list_dead_letters, replay
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.ops.ops_cli import app
from bandgate.topology import wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import load_topology
from bandgate.topology.model import QueueSpec, Topology
from bandgate.topology.wire import ATTEMPTS, FAILURE_CAUSE, FAILURE_REASON, ORIGINAL_BAND
from tests.integration.conftest import queue_depths

pytestmark = pytest.mark.integration

NOW = wire.from_millis(1_800_000_000_000)


def write_topology(topology: Topology, directory: Path) -> Path:
    """`topology` as a TOML file the CLI can read (checked to load back the same)."""
    lines = [f'exchange = "{topology.exchange}"', "[delay]"]
    lines += [f"base_ms = {topology.delay.base_ms}", f"levels = {topology.delay.levels}"]
    for spec in topology.queues.values():
        retry = spec.retry
        lines += [
            f"[queues.{spec.name}]",
            f"retry = {{ max_attempts = {retry.max_attempts}, "
            f"max_deliveries = {retry.max_deliveries} }}",
        ]
        for band in spec.bands:
            lines += [
                f"[[queues.{spec.name}.bands]]",
                f'name = "{band.name}"',
                f"priorities = [{band.low}, {band.high}]",
                f'type = "{band.type}"',
            ]
            if band.age_after_seconds is not None:
                lines.append(f"age_after_seconds = {band.age_after_seconds}")
    path = directory / "bandgate.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert load_topology(path) == topology
    return path


# Pure parts: no broker.


def failure_headers(**more: object) -> dict[str, object]:
    headers: dict[str, object] = {
        wire.ENQUEUED_AT: wire.to_millis(NOW - timedelta(hours=1)),
        wire.QUEUE: "orders",
        wire.ATTEMPT: 5,
        wire.PARTITION_KEY: "customer-7",
        "tenant": "acme",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        FAILURE_REASON: "ValueError: no such SKU",
        FAILURE_CAUSE: "max-attempts",
        "x-bandgate-failure-type": "ValueError",
        ATTEMPTS: 5,
        ORIGINAL_BAND: "warm",
        "x-bandgate-failed-at": wire.to_millis(NOW - timedelta(minutes=10)),
        "x-delivery-count": 2,
        "x-death": [{"reason": "expired", "queue": "bandgate.delay.03", "count": 1}],
        "x-first-death-queue": "bandgate.delay.03",
    }
    headers.update(more)
    return headers


def test_a_workers_dead_letter_reads_back(topology: Topology) -> None:
    spec = topology.queue("orders")
    record = read_dead_letter(
        spec, failure_headers(), message_id="m-1", priority=5, timestamp=None, now=NOW
    )
    assert record.message_id == "m-1"
    assert (record.cause, record.reason, record.error_type) == (
        "max-attempts",
        "ValueError: no such SKU",
        "ValueError",
    )
    assert (record.attempts, record.original_band, record.priority) == (5, "warm", 5)
    assert record.age_seconds == 600.0
    assert record.enqueued_at == NOW - timedelta(hours=1)
    assert record.replays == 0
    assert record.to_json()["failed_at"] == (NOW - timedelta(minutes=10)).isoformat()


def test_a_broker_dead_letter_reads_back_from_x_death(topology: Topology) -> None:
    spec = topology.queue("orders")
    died = NOW - timedelta(seconds=30)
    headers = {"x-death": [{"reason": "delivery_limit", "queue": "orders.hot", "time": died}]}
    record = read_dead_letter(spec, headers, message_id="m", priority=8, timestamp=None, now=NOW)
    assert record.cause == "delivery-limit"
    assert record.reason == "dead-lettered by RabbitMQ from orders.hot (delivery_limit)"
    assert (record.original_band, record.age_seconds) == ("hot", 30.0)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [(None, True), ("", True), ("MAX-ATTEMPTS", True), ("sku", True), ("valueerror", True)],
)
def test_the_reason_filter_looks_at_cause_reason_and_type(
    topology: Topology, reason: str | None, expected: bool
) -> None:
    record = read_dead_letter(
        topology.queue("orders"),
        failure_headers(),
        message_id="m",
        priority=5,
        timestamp=None,
        now=NOW,
    )
    assert matches(record, reason) is expected
    assert matches(record, "rejected") is False


def record_of(spec: QueueSpec, priority: int | None, band: str | None) -> DeadLetter:
    headers = failure_headers(**{ORIGINAL_BAND: band}) if band else {}
    return read_dead_letter(
        spec, headers, message_id="m", priority=priority, timestamp=None, now=NOW
    )


@pytest.mark.parametrize(
    ("priority", "band", "expected"),
    [
        (5, "warm", 5),  # its own band
        (2, "warm", 4),  # promoted by aging from cold: raised into warm
        (8, None, 8),  # no band known: its priority decides
        (None, "hot", 7),  # no priority: the band's lowest
        (None, None, 0),  # neither: the coldest band's lowest
        (5, "gone", 5),  # a band no longer in the topology
    ],
)
def test_a_replay_goes_back_to_the_original_band(
    topology: Topology, priority: int | None, band: str | None, expected: int
) -> None:
    spec = topology.queue("orders")
    assert replay_priority(spec, record_of(spec, priority, band)) == expected


def test_the_replay_envelope_is_a_fresh_first_attempt(topology: Topology) -> None:
    spec = topology.queue("orders")
    headers = failure_headers(**{REPLAYS: 1})
    record = read_dead_letter(spec, headers, message_id="m-1", priority=5, timestamp=None, now=NOW)
    envelope = replay_envelope(spec, record, b'{"sku": 1}', headers, "application/json")
    assert isinstance(envelope, wire.Envelope)
    message = wire.encode(envelope)
    assert message.body == b'{"sku": 1}'
    assert (message.message_id, message.priority) == ("m-1", 5)
    sent = dict(message.headers)
    assert sent[wire.ATTEMPT] == 1
    assert sent[REPLAYS] == 2
    assert sent[wire.PARTITION_KEY] == "customer-7"
    assert sent[wire.ENQUEUED_AT] == wire.to_millis(NOW - timedelta(hours=1))
    assert sent["tenant"] == "acme"
    assert "traceparent" in sent
    dropped = [FAILURE_REASON, FAILURE_CAUSE, ATTEMPTS, ORIGINAL_BAND, "x-bandgate-failed-at"]
    dropped += ["x-death", "x-first-death-queue", "x-delivery-count"]
    assert not set(dropped) & set(sent)


def test_a_non_json_dead_letter_is_not_replayed(topology: Topology) -> None:
    spec = topology.queue("orders")
    record = record_of(spec, 5, "warm")
    problem = replay_envelope(spec, record, b"\x00", {}, "application/octet-stream")
    assert isinstance(problem, str)
    assert "application/octet-stream" in problem
    assert isinstance(
        replay_envelope(spec, record, b"1", {}, "application/cloudevents+json"), wire.Envelope
    )


# On the broker.


@dataclass(frozen=True)
class Sample:
    message_id: str
    band: str
    priority: int
    cause: DeadLetterCause


SAMPLES = (
    Sample("d-0", "hot", 8, "max-attempts"),
    Sample("d-1", "warm", 5, "rejected"),
    Sample("d-2", "cold", 1, "max-attempts"),
    Sample("d-3", "warm", 2, "rejected"),  # promoted from cold by aging before it failed
    Sample("d-4", "hot", 9, "max-attempts"),
)


async def dead_letter(publisher: Publisher, sample: Sample) -> None:
    """What a worker does when it gives up on a message."""
    envelope = wire.Envelope(
        queue="orders",
        payload={"order": sample.message_id},
        priority=sample.priority,
        message_id=sample.message_id,
        headers={"tenant": "acme"},
        attempt=5 if sample.cause == "max-attempts" else 1,
    )
    delivered = wire.encode(envelope)
    message = Message(
        payload=envelope.payload,
        queue="orders",
        band=sample.band,
        priority=sample.priority,
        message_id=sample.message_id,
        attempt=envelope.attempt,
        enqueued_at=envelope.enqueued_at,
    )
    outcome = DeadLetterOutcome(
        sample.cause,
        "ValueError: boom" if sample.cause == "max-attempts" else "Reject: bad order",
        "ValueError" if sample.cause == "max-attempts" else None,
    )
    copy = dead_letter_message(
        delivered.body, delivered.headers, delivered.content_type, message, outcome, wire.now()
    )
    await publisher.dead_letter(copy, "orders")


@pytest.fixture
async def dead(amqp_url: str, topology: Topology) -> AsyncIterator[AbstractRobustConnection]:
    """A vhost with the topology and the SAMPLES dead-lettered in orders.dlq."""
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        channels = ChannelSet(confirm_channel_factory(connection), size=1)
        publisher = Publisher(topology, channels)
        for sample in SAMPLES:
            await dead_letter(publisher, sample)
        await channels.close()
        yield connection


async def depths_settle(
    connection: AbstractRobustConnection, topology: Topology, expected: dict[str, int]
) -> dict[str, int]:
    """Queue depths once they show `expected` (returns and acks reach a quorum queue's state
    a moment after they are sent), or as they are after 30 s (a bound for a loaded machine)."""
    deadline = time.monotonic() + 30
    while True:
        depths = await queue_depths(connection, topology)
        settled = all(depths[name] == count for name, count in expected.items())
        if settled or time.monotonic() > deadline:
            return depths
        await asyncio.sleep(0.05)


async def test_listing_keeps_every_dead_letter_in_order(
    dead: AbstractRobustConnection, topology: Topology
) -> None:
    before = await depths_settle(dead, topology, {"orders.dlq": len(SAMPLES)})
    first = await list_dead_letters(dead, topology, "orders")
    assert [r.message_id for r in first] == [s.message_id for s in SAMPLES]
    assert [r.original_band for r in first] == [s.band for s in SAMPLES]
    assert first[0].cause == "max-attempts"
    assert first[0].attempts == 5
    assert first[1].reason == "Reject: bad order"

    assert await depths_settle(dead, topology, before) == before
    limited = await list_dead_letters(dead, topology, "orders", limit=2, reason="rejected")
    assert [r.message_id for r in limited] == ["d-1", "d-3"]
    again = await list_dead_letters(dead, topology, "orders")
    assert [r.message_id for r in again] == [s.message_id for s in SAMPLES]
    assert await depths_settle(dead, topology, before) == before


async def test_replay_by_reason_leaves_the_rest_in_order(
    dead: AbstractRobustConnection, topology: Topology
) -> None:
    seen: list[int] = []
    result = await replay(
        dead, topology, "orders", reason="rejected", progress=lambda p: seen.append(p.examined)
    )
    assert (result.examined, result.replayed, result.skipped, result.error) == (5, 2, 3, None)
    assert seen == [0, 1, 2, 3, 4, 5]
    depths = await depths_settle(dead, topology, {"orders.dlq": 3, "orders.warm": 2})
    assert (depths["orders.dlq"], depths["orders.warm"], depths["orders.cold"]) == (3, 2, 0)
    left = await list_dead_letters(dead, topology, "orders")
    assert [r.message_id for r in left] == ["d-0", "d-2", "d-4"]

    limited = await replay(dead, topology, "orders", limit=1, rate=50)
    assert (limited.examined, limited.replayed) == (1, 1)
    depths = await depths_settle(dead, topology, {"orders.dlq": 2, "orders.hot": 1})
    assert (depths["orders.dlq"], depths["orders.hot"]) == (2, 1)


async def get_all(
    connection: AbstractRobustConnection, queue: str
) -> list[AbstractIncomingMessage]:
    channel = await connection.channel()
    target = await channel.get_queue(queue)
    messages = []
    while (message := await target.get(no_ack=True, fail=False)) is not None:
        messages.append(message)
    await channel.close()
    return messages


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "BANDGATE_MANAGEMENT_URL": None})


@pytest.fixture
def topology_path(topology: Topology, tmp_path: Path) -> Path:
    return write_topology(topology, tmp_path)


def test_the_cli_lists_replays_with_a_progress_bar_and_purges_with_yes(
    runner: CliRunner, amqp_url: str, topology: Topology, topology_path: Path
) -> None:
    async def prepare() -> dict[str, int]:
        connection = await aio_pika.connect_robust(amqp_url)
        async with connection:
            await apply_topology(connection, topology)
            channels = ChannelSet(confirm_channel_factory(connection), size=1)
            for sample in SAMPLES:
                await dead_letter(Publisher(topology, channels), sample)
            await channels.close()
            return await depths_settle(connection, topology, {"orders.dlq": len(SAMPLES)})

    async def settled(expected: dict[str, int]) -> dict[str, int]:
        connection = await aio_pika.connect_robust(amqp_url)
        async with connection:
            return await depths_settle(connection, topology, expected)

    async def band_messages() -> dict[str, list[AbstractIncomingMessage]]:
        connection = await aio_pika.connect_robust(amqp_url)
        async with connection:
            return {b: await get_all(connection, f"orders.{b}") for b in ("hot", "warm", "cold")}

    before = asyncio.run(prepare())
    common = ["--topology", str(topology_path), "--amqp-url", amqp_url]

    listed = runner.invoke(app, ["dlq", "list", "orders", *common])
    assert listed.exit_code == 0, listed.output
    assert "orders.dlq: 5 of 5 dead letters, oldest first" in listed.stdout
    for sample in SAMPLES:
        assert sample.message_id in listed.stdout
    assert asyncio.run(settled(before)) == before

    refused = runner.invoke(app, ["dlq", "purge", "orders", *common])
    assert refused.exit_code == 1
    assert refused.stderr == (
        "error: purge deletes every message in orders.dlq for good; add --yes to confirm\n"
    )
    assert asyncio.run(settled(before)) == before

    replayed = runner.invoke(app, ["dlq", "replay", "orders", "--limit", "4", *common])
    assert replayed.exit_code == 0, replayed.output
    assert "Replaying orders.dlq" in replayed.stderr
    assert "━" in replayed.stderr  # the bar
    assert "replayed 4, skipped 0" in replayed.stderr
    assert "Replayed 4 of 4 examined dead letters from orders.dlq" in replayed.stdout
    after = asyncio.run(settled({"orders.dlq": 1}))
    assert (after["orders.dlq"], after["orders.hot"], after["orders.warm"]) == (1, 1, 2)
    assert after["orders.cold"] == 1
    assert sum(after.values()) == len(SAMPLES)

    bands = asyncio.run(band_messages())
    assert [m.message_id for m in bands["warm"]] == ["d-1", "d-3"]
    promoted = bands["warm"][1]
    assert promoted.priority == 4  # raised into warm, the band it had reached
    headers = dict(promoted.headers)
    assert (headers[wire.ATTEMPT], headers[REPLAYS], headers["tenant"]) == (1, 1, "acme")
    assert FAILURE_CAUSE not in headers
    assert "x-death" not in headers
    assert promoted.body == b'{"order":"d-3"}'

    purged = runner.invoke(app, ["dlq", "purge", "orders", "--yes", *common])
    assert purged.exit_code == 0, purged.output
    assert purged.stdout == "Purged 1 dead letters from orders.dlq.\n"
    assert asyncio.run(settled({"orders.dlq": 0}))["orders.dlq"] == 0


def test_cli_failures_are_one_line_without_the_password(
    runner: CliRunner, amqp_url: str, topology_path: Path
) -> None:
    unknown = runner.invoke(
        app, ["dlq", "list", "nope", "--topology", str(topology_path), "--amqp-url", amqp_url]
    )
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("error: unknown queue 'nope'")

    missing = runner.invoke(
        app, ["dlq", "list", "orders", "--topology", str(topology_path), "--amqp-url", amqp_url]
    )
    assert missing.exit_code == 1
    # ...and names the broker it asked, and what chose it.
    where = amqp_url.replace("guest:guest", "guest:***")
    assert missing.stderr == (
        "error: dead-letter queue 'orders.dlq' does not exist: run `bandgate topology apply` "
        f"(RabbitMQ at {where} (from the URL given explicitly))\n"
    )

    refused = amqp_url.replace("guest:guest", "guest:s3cret-pw")
    wrong = runner.invoke(
        app, ["stats", "orders", "--topology", str(topology_path), "--amqp-url", refused]
    )
    assert wrong.exit_code == 1
    assert wrong.stderr.count("\n") == 1
    assert "s3cret-pw" not in wrong.output
    assert "Traceback" not in wrong.output

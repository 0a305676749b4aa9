"""Queue statistics on a real broker: per-band counts, the head's age where the broker tracks it,
the delay ladder and the dead-letter queue; and `bandgate stats`."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import aio_pika
import orjson
import pytest
from typer.testing import CliRunner

from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.core.queue_stats import QueueStats, collect_queue_stats, head_age_seconds
from bandgate.ops.ops_cli import app
from bandgate.topology import wire
from bandgate.topology.declare import apply_topology, broker_version, parse_version
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope
from tests.broker import TestBroker
from tests.integration.test_dead_letters import write_topology

pytestmark = pytest.mark.integration

NOW = wire.from_millis(1_800_000_000_000)


def test_head_age_comes_from_the_management_view() -> None:
    stamp = NOW.timestamp() - 90
    assert head_age_seconds({"head_message_timestamp": stamp}, 3, NOW) == 90.0
    assert head_age_seconds({"head_message_timestamp": stamp}, 0, NOW) is None  # empty band
    assert head_age_seconds({"head_message_timestamp": None}, 3, NOW) is None  # quorum, 3.x
    assert head_age_seconds({}, 3, NOW) is None
    assert head_age_seconds(None, 3, NOW) is None  # no management API
    assert head_age_seconds({"head_message_timestamp": NOW.timestamp() + 5}, 1, NOW) == 0.0


async def publish_sample(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        channels = ChannelSet(confirm_channel_factory(connection), size=1)
        publisher = Publisher(topology, channels)
        a_minute_ago = wire.now() - timedelta(seconds=60)
        for queue, priority in (("orders", 9), ("orders", 8), ("orders", 5), ("emails", 1)):
            await publisher.publish(
                Envelope(queue=queue, payload={}, priority=priority, enqueued_at=a_minute_ago)
            )
        later = wire.now() + timedelta(seconds=30)
        await publisher.publish(Envelope(queue="orders", payload={}, priority=1, deliver_at=later))
        await publisher.dead_letter(wire.encode(Envelope("orders", {}, 4)), "orders")
        await channels.close()


async def stats_when(
    amqp_url: str, topology: Topology, queue: str, management: ManagementClient, band: int
) -> QueueStats:
    """Stats once the management API shows the head's age of `band` (its figures are
    refreshed every 5 s), or as they are after 15 s."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        deadline = time.monotonic() + 15
        while True:
            stats = await collect_queue_stats(
                connection, topology, topology.queue(queue), management
            )
            known = stats["bands"][band]["oldest_ready_age_seconds"] is not None
            if known or time.monotonic() > deadline:
                return stats
            await asyncio.sleep(0.25)


def test_stats_count_bands_delays_and_dead_letters(
    broker: TestBroker, amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    asyncio.run(publish_sample(amqp_url, topology))
    topology_path = write_topology(topology, tmp_path)
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "BANDGATE_MANAGEMENT_URL": None})
    common = ["--topology", str(topology_path), "--amqp-url", amqp_url]
    as_json = runner.invoke(
        app, ["stats", "orders", "--json", *common, "--management-url", broker.management_url]
    )
    assert as_json.exit_code == 0, as_json.output
    orders = orjson.loads(as_json.stdout)
    assert [(b["band"], b["ready"], b["consumers"]) for b in orders["bands"]] == [
        ("hot", 2, 0),
        ("warm", 1, 0),
        ("cold", 0, 0),
    ]
    assert (orders["ready"], orders["delayed"], orders["dead_lettered"]) == (3, 1, 1)
    assert orders["delayed_scope"] == "deployment"
    assert orders["bands"][2]["oldest_ready_age_seconds"] is None  # empty
    for band in orders["bands"][:2]:  # quorum: null on 3.x; where a broker tells, a minute
        age = band["oldest_ready_age_seconds"]
        assert age is None or age >= 55

    table = runner.invoke(app, ["stats", "orders", *common])
    assert table.exit_code == 0, table.output
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if line.startswith("│")}
    assert rows["hot"].split("│")[4].strip() == "2"  # ready
    assert rows["hot"].split("│")[5].strip() == "-"  # unacked: no management API
    assert "ready 3, delayed 1 (all queues: the delay ladder is shared), dead-lettered 1" in (
        table.stdout
    )
    assert "need --management-url" in table.stdout

    # The head's age shows once the management API has refreshed (every 5 s).
    management = ManagementClient(broker.management_url, vhost_of(amqp_url))
    emails = asyncio.run(stats_when(amqp_url, topology, "emails", management, band=1))
    cold = emails["bands"][1]
    assert (cold["band"], cold["queue"], cold["ready"], cold["consumers"]) == (
        "cold",
        "emails.cold",
        1,
        0,
    )
    # A classic band reports the age of its head message (its AMQP timestamp).
    assert cold["oldest_ready_age_seconds"] is not None
    assert 55 <= cold["oldest_ready_age_seconds"] < 120
    assert cold["unacked"] == 0


def test_ready_by_priority_where_the_broker_counts_it(
    broker: TestBroker, amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    asyncio.run(publish_sample(amqp_url, topology))
    management = ManagementClient(broker.management_url, vhost_of(amqp_url))

    async def when_counted() -> tuple[QueueStats, tuple[int, ...]]:
        connection = await aio_pika.connect(amqp_url)
        async with connection:
            version = parse_version(broker_version(connection))
            deadline = time.monotonic() + (15 if version >= (4, 3) else 6)
            while True:  # the management API refreshes its figures every 5 s
                stats = await collect_queue_stats(
                    connection, topology, topology.queue("orders"), management
                )
                if stats["bands"][1]["ready_by_priority"] or time.monotonic() > deadline:
                    return stats, version
                await asyncio.sleep(0.25)

    stats, version = asyncio.run(when_counted())
    hot, warm, cold = stats["bands"]
    if version >= (4, 3):  # quorum queues count ready messages per priority
        assert hot["ready_by_priority"] == {"9": 1, "8": 1}
        assert list(hot["ready_by_priority"]) == ["9", "8"]  # highest first
        assert warm["ready_by_priority"] == {"5": 1}
        assert cold["ready_by_priority"] == {}
    else:
        assert [band["ready_by_priority"] for band in stats["bands"]] == [None, None, None]
    assert (hot["ready"], warm["ready"]) == (2, 1)

    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    common = ["--topology", str(write_topology(topology, tmp_path)), "--amqp-url", amqp_url]
    table = runner.invoke(
        app, ["stats", "orders", *common, "--management-url", broker.management_url]
    )
    assert table.exit_code == 0, table.output
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if line.startswith("│")}
    if version >= (4, 3):
        assert rows["hot"].split("│")[8].strip() == "9:1 8:1"
        assert rows["cold"].split("│")[8].strip() == "0"
    else:
        assert "Ready by priority" not in table.stdout

"""A worker's slots on its metrics: who holds them, what waits, what the headroom keeps free."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aio_pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.core.telemetry import Telemetry
from bandgate.topology.declare import apply_topology
from bandgate.topology.model import Topology
from bandgate.topology.wire import Envelope

pytestmark = pytest.mark.integration

SLOTS = 4
LOAD = ("bandgate_consumer_hotter_load", "")

Gauges = dict[tuple[str, str], float]


def gauges(telemetry: Telemetry) -> Gauges:
    """Every `bandgate_consumer_*` sample of queue orders, by (name, band or "")."""
    text = telemetry.prometheus_text().decode()
    return {
        (sample.name, sample.labels.get("band", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("bandgate_consumer_") and sample.labels["queue"] == "orders"
    }


async def until(telemetry: Telemetry, check: Callable[[Gauges], bool], what: object) -> Gauges:
    """The gauges once `check` holds for them (waiting up to 30 s, for a loaded machine; they
    are sampled once a second); fail showing what they read."""
    seen: Gauges = {}
    try:
        async with asyncio.timeout(30):
            while not check(seen):
                await asyncio.sleep(0.05)
                seen = gauges(telemetry)
    except TimeoutError:
        raise AssertionError(f"the gauges read {seen}, not {what}") from None
    return seen


async def until_read(telemetry: Telemetry, wanted: Gauges) -> None:
    await until(telemetry, lambda seen: all(seen.get(k) == v for k, v in wanted.items()), wanted)


async def test_gauges_show_busy_slots_messages_at_hand_and_the_headroom(
    amqp_url: str, topology: Topology
) -> None:
    telemetry = Telemetry("bandgate-worker")
    settings = WorkerSettings(amqp_url=amqp_url, cold_boost_seconds=60)
    app = ConsumerApp(settings, topology=topology)
    release = asyncio.Event()
    started: list[str] = []

    @app.consumer("orders", concurrency=SLOTS)
    async def handle(msg: Message) -> None:
        started.append(msg.band)
        await release.wait()

    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)), 5)
        for priority in [1] * 4 + [8] * 6:  # the cold backlog first, then hot work
            await publisher.publish(Envelope(queue="orders", payload={}, priority=priority))
        worker = Worker(app, telemetry=telemetry)
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(worker.ready.wait(), 30)

        # Hot work takes every slot; two hot and four cold messages wait at hand.
        await until_read(
            telemetry,
            {
                ("bandgate_consumer_slots", ""): SLOTS,
                ("bandgate_consumer_busy_slots", "hot"): SLOTS,
                ("bandgate_consumer_busy_slots", "warm"): 0,
                ("bandgate_consumer_busy_slots", "cold"): 0,
                ("bandgate_consumer_at_hand", "hot"): 2,
                ("bandgate_consumer_at_hand", "cold"): 4,
            },
        )
        assert started == ["hot"] * SLOTS
        # Hot work held every slot since it came: its average load climbs to all of them,
        # and the headroom keeps a slot from cold work while hot messages keep coming.
        read = await until(telemetry, lambda seen: seen.get(LOAD, 0) >= SLOTS - 0.5, "load")
        assert read[LOAD] <= SLOTS
        (runner,) = worker.runners
        headroom = runner.dispatcher.headroom
        assert headroom is not None
        assert read[("bandgate_consumer_reserved_slots", "")] == headroom.reserve() >= 1

        # Everything runs to its end: nothing busy, nothing waiting.
        release.set()
        await until_read(
            telemetry,
            {
                **{("bandgate_consumer_busy_slots", band): 0 for band in ("hot", "warm", "cold")},
                **{("bandgate_consumer_at_hand", band): 0 for band in ("hot", "warm", "cold")},
            },
        )
        assert sorted(started) == ["cold"] * 4 + ["hot"] * 6
        worker.stop()
        await asyncio.wait_for(running, 30)
        await publisher.channels.close()

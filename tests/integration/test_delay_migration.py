"""Moving a deployment from the old delay ladder (`bandgate.delay.NN`) to the current one
(`zz.bandgate.delay.NN`, another number of levels) without losing or doubling a delayed message;
the doctor's report of the old ladder, `bandgate topology prune`, and the management UI's order.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import aio_pika
import pytest
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)
from pamqp.common import Arguments
from typer.testing import CliRunner, Result

from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.ops.topology_cli import app
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology, declare_exchange
from bandgate.topology.delay import DelayLadder
from bandgate.topology.doctor import check_broker
from bandgate.topology.legacy import probe as probe_legacy
from bandgate.topology.loader import parse_topology
from bandgate.topology.management import vhost_of
from bandgate.topology.model import Topology
from bandgate.topology.objects import BindingDecl, ExchangeDecl, Plan, QueueDecl, plan
from bandgate.topology.wire import Envelope
from tests.broker import TestBroker
from tests.integration.test_delay import in_, ready, wait_until

pytestmark = pytest.mark.integration

OLD_LEVELS = 12  # the old ladder; the new one below has 8, so the bit patterns differ too


TOPOLOGY_TOML = """
[delay]
base_ms = 50
levels = 8
[queues.orders]
[queues.tasks]
ordered = true
bands = [{ name = "all", priorities = [0, 9], shards = 2 }]
"""


@pytest.fixture
def topology() -> Topology:
    return parse_topology(tomllib.loads(TOPOLOGY_TOML))


def old_name(name: str) -> str:
    """A name as the old code wrote it: the legacy rule is today's name without the prefix."""
    return name.removeprefix(naming.INTERNAL_PREFIX)


def old_plan(topology: Topology) -> Plan:
    """What the old code declared for `topology` with OLD_LEVELS levels: the same plan, every
    internal name (and dead-letter target) under its legacy name."""
    old = topology.delay.model_copy(update={"levels": OLD_LEVELS})
    objects = plan(topology.model_copy(update={"delay": old}))
    queues = []
    for queue in objects.queues:
        arguments = dict(queue.arguments)
        if "x-dead-letter-exchange" in arguments:
            arguments["x-dead-letter-exchange"] = old_name(str(arguments["x-dead-letter-exchange"]))
        queues.append(QueueDecl(old_name(queue.name), cast(Any, arguments)))
    return Plan(
        tuple(ExchangeDecl(old_name(e.name), e.type, e.arguments) for e in objects.exchanges),
        tuple(queues),
        tuple(
            BindingDecl(
                old_name(b.source), old_name(b.destination), b.routing_key, b.destination_type
            )
            for b in objects.bindings
        ),
    )


async def declare(channel: AbstractChannel, objects: Plan) -> None:
    for exchange in objects.exchanges:
        await declare_exchange(channel, exchange)
    for queue in objects.queues:
        arguments = cast(Arguments, dict(queue.arguments))
        await channel.declare_queue(queue.name, durable=True, arguments=arguments)
    underlay = await channel.get_underlay_channel()
    for binding in objects.bindings:
        if binding.destination_type == "queue":
            await underlay.queue_bind(binding.destination, binding.source, binding.routing_key)
        else:
            await underlay.exchange_bind(binding.destination, binding.source, binding.routing_key)


@dataclass
class Deployment:
    connection: AbstractConnection
    channel: AbstractChannel
    topology: Topology
    old_levels: list[str]

    async def delay_through_old_ladder(self, seconds: float) -> Envelope:
        """Publish as the old gateway did: into the old ladder, keyed for OLD_LEVELS levels."""
        envelope = Envelope(queue="orders", payload="old", priority=8, deliver_at=in_(seconds))
        old = DelayLadder(self.topology.exchange, self.topology.delay.base_ms, OLD_LEVELS)
        route = old.route(seconds * 1000, "orders", 8)
        assert route is not None
        exchange = await self.channel.get_exchange(old_name(route.exchange))
        message = aio_pika.Message(b'"old"', message_id=envelope.message_id)
        await exchange.publish(message, route.routing_key, mandatory=True)
        return envelope

    async def held_by_old_ladder(self) -> int:
        return sum([await ready(self.channel, name) for name in self.old_levels])


@pytest.fixture
async def deployment(amqp_url: str, topology: Topology) -> AsyncIterator[Deployment]:
    """A vhost as the old code left it: bands, DLQs and the old ladder, nothing of the new."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        objects = old_plan(topology)
        await declare(channel, objects)
        levels = [naming.legacy_delay_level(topology.exchange, k) for k in range(OLD_LEVELS)]
        assert set(levels) <= {queue.name for queue in objects.queues}
        yield Deployment(connection, channel, topology, levels)


async def band(channel: AbstractChannel) -> AbstractQueue:
    return await channel.declare_queue("orders.hot", passive=True)


async def test_a_message_in_the_old_ladder_arrives_once_on_time_after_the_upgrade(
    deployment: Deployment,
) -> None:
    old = await deployment.delay_through_old_ladder(1.5)
    assert await deployment.held_by_old_ladder() == 1
    await apply_topology(deployment.connection, deployment.topology)  # the upgrade

    # New publishes go through the new ladder at once, and arrive as before.
    channels = ChannelSet(confirm_channel_factory(deployment.connection), size=1)
    new = Envelope(queue="orders", payload="new", priority=8, deliver_at=in_(0.5))
    assert deployment.topology.ladder.route(500, "orders", 8) is not None
    assert isinstance(await Publisher(deployment.topology, channels).publish(new), Published)
    await channels.close()

    arrived: dict[str, float] = {}
    hot = await band(deployment.channel)

    async def both_arrived() -> bool:
        while (message := await hot.get(no_ack=True, fail=False)) is not None:
            assert message.message_id not in arrived, "a delayed message arrived twice"
            arrived[str(message.message_id)] = time.time()
        return len(arrived) == 2

    assert await wait_until(both_arrived, deadline=time.monotonic() + 4)
    for envelope in (old, new):
        assert envelope.deliver_at is not None
        lateness = arrived[envelope.message_id] - envelope.deliver_at.timestamp()
        assert -0.025 <= lateness < 1.0, f"{envelope.payload} off by {lateness:.3f} s"

    # Both ladders are empty, so any second copy would be in the band by now.
    levels = [naming.delay_level(deployment.topology.exchange, k) for k in range(8)]
    assert sum([await ready(deployment.channel, name) for name in levels]) == 0
    assert await deployment.held_by_old_ladder() == 0
    assert await ready(deployment.channel, "orders.hot") == 0


async def test_doctor_reports_the_old_ladder_and_what_it_holds(
    deployment: Deployment, broker: TestBroker, amqp_url: str
) -> None:
    await deployment.delay_through_old_ladder(30)
    await apply_topology(deployment.connection, deployment.topology)
    report = await check_broker(deployment.connection, deployment.topology, None)
    finding = next(f for f in report.findings if f.code == "legacy_delay_ladder")
    assert finding.severity == "warning"
    assert "bandgate.delay.00 .. bandgate.delay.11 (12 levels" in finding.message
    assert "still holds 1 message(s)" in finding.message
    assert "`bandgate topology prune`" in finding.message
    assert report.ok  # a warning: the gateway still starts

    async def management_counts_it() -> bool:  # its statistics lag a few seconds behind
        report = await check_broker(
            deployment.connection, deployment.topology, broker.management_url, vhost_of(amqp_url)
        )
        return any("still holds 1 message(s)" in f.message for f in report.findings)

    assert await wait_until(management_counts_it, time.monotonic() + 15, interval=0.5)


async def test_prune_refuses_while_the_old_ladder_holds_messages_then_removes_it(
    deployment: Deployment, amqp_url: str, tmp_path: Path
) -> None:
    topology = deployment.topology
    await apply_topology(deployment.connection, topology)
    await deployment.delay_through_old_ladder(0.5)
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})
    toml = tmp_path / "bandgate.toml"
    toml.write_text(TOPOLOGY_TOML, encoding="utf-8")
    args = ["prune", "--topology", str(toml), "--amqp-url", amqp_url]

    def prune() -> Result:  # the CLI runs its own event loop
        return runner.invoke(app, args)

    old_workers = await deployment.channel.declare_queue("bandgate.workers.tasks", passive=True)

    async def nothing_arrives(message: AbstractIncomingMessage) -> None:
        raise AssertionError("a workers queue never holds a message")

    old_worker = await old_workers.consume(nothing_arrives)
    refused = await asyncio.to_thread(prune)
    assert refused.exit_code == 1
    assert "the old delay ladder still holds 1 message(s)" in refused.stderr
    assert "bandgate.workers.tasks still has 1 consumer(s)" in refused.stderr
    assert "--force" in refused.stderr
    await old_workers.cancel(old_worker)
    assert (await probe_legacy(deployment.connection, topology)).delayed == 1

    async def delivered() -> bool:
        return await ready(deployment.channel, "orders.hot") == 1

    assert await wait_until(delivered, time.monotonic() + 3)
    removed = await asyncio.to_thread(prune)
    assert removed.exit_code == 0, removed.output
    assert "Removed 13 queues and 13 exchanges of an older bandgate" in removed.stdout
    assert not await probe_legacy(deployment.connection, topology)
    assert (await asyncio.to_thread(prune)).stdout.startswith("Nothing to prune")
    report = await check_broker(deployment.connection, topology, None)
    assert not [f for f in report.findings if f.code.startswith("legacy")]
    # The new ladder is untouched and still delivers.
    channels = ChannelSet(confirm_channel_factory(deployment.connection), size=1)
    envelope = Envelope(queue="orders", payload="after", priority=8, deliver_at=in_(0.2))
    assert isinstance(await Publisher(topology, channels).publish(envelope), Published)
    await channels.close()

    async def both() -> bool:
        return await ready(deployment.channel, "orders.hot") == 2

    assert await wait_until(both, time.monotonic() + 3)


async def test_the_management_ui_lists_the_bands_before_bandgate_internal_queues(
    amqp: AbstractConnection, broker: TestBroker, amqp_url: str
) -> None:
    """Its Queues page opens without a sort (the API's default order), or sorted by name."""
    topology = parse_topology(
        {
            "delay": {"levels": 26},
            "queues": {
                "orders": {},
                "zulu": {
                    "ordered": True,
                    "bands": [{"name": "all", "priorities": [0, 9], "shards": 2}],
                },
            },
        }
    )
    await apply_topology(amqp, topology)
    vhost = quote(vhost_of(amqp_url), safe="")
    ui_first_page = "page=1&page_size=100&name=&use_regex=false&pagination=true"
    with broker.management() as api:
        for query in (ui_first_page, "sort=name", f"{ui_first_page}&sort=name&sort_reverse=false"):
            response = api.get(f"/api/queues/{vhost}?{query}")
            response.raise_for_status()
            body = response.json()
            names = [q["name"] for q in (body["items"] if isinstance(body, dict) else body)]
            internal = [n for n in names if n.startswith(naming.INTERNAL_PREFIX)]
            assert naming.workers_queue(topology.exchange, "zulu") in internal
            assert naming.ledger_stream(topology.exchange) in internal
            assert len(internal) == 28  # 26 delay levels, the workers queue, the ledger
            assert names[: len(names) - 28] == [
                "orders.cold",
                "orders.dlq",
                "orders.hot",
                "orders.warm",
                "zulu.all.0",
                "zulu.all.1",
                "zulu.dlq",
            ], query

"""Leaders spread over a three-node cluster: applied through one node, bandgate's replicated
queues no longer all lead on it; a sharded band's shards lead on different nodes; a deployment
an older bandgate made (every leader on one node) is spread by `rabbitmq-queues rebalance all`
without losing a message; `bandgate doctor` shows leaders per node and warns on skew; the
Producer's traffic to a sharded band reaches a leader on every node."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import cast
from urllib.parse import quote

import aio_pika
import pytest
from aio_pika.abc import AbstractConnection
from pamqp.common import Arguments

from bandgate.core.producer import Producer
from bandgate.ops.local_broker import QUEUES
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.doctor import check_broker
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.objects import plan, replicated_queues
from bandgate.topology.placement import fair_share
from tools.local_cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.fault]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    plugins = ("rabbitmq_management", "rabbitmq_consistent_hash_exchange")
    local = LocalCluster(tmp_path_factory.mktemp("cluster"), plugins=plugins)
    try:
        yield local.start()
    finally:
        local.stop()


@pytest.fixture
def sharded() -> Topology:
    """The shipped shape with its cold band in three shards."""
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"levels": 12},
            "queues": {
                "orders": {
                    "bands": [
                        {"name": "hot", "priorities": [7, 9]},
                        {"name": "warm", "priorities": [4, 6]},
                        {"name": "cold", "priorities": [0, 3], "shards": 3},
                    ]
                },
                "emails": {},
            },
        }
    )


@pytest.fixture
def vhost(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.node.name[:40]
    first = cluster.nodes[0]
    first.ctl("add_vhost", name)
    first.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    try:
        yield name
    finally:
        first.ctl("delete_vhost", name, timeout=120)


@pytest.fixture
async def connection(cluster: LocalCluster, vhost: str) -> AsyncIterator[AbstractConnection]:
    """A client connected to the first node only, as `bandgate topology apply` is."""
    url = cluster.nodes[0].amqp_url.rstrip("/") + "/" + quote(vhost, safe="")
    async with await aio_pika.connect(url) as opened:
        yield opened


def per_node(leaders: dict[str, str]) -> Counter[str]:
    return Counter(leaders.values())


async def test_a_topology_applied_through_one_node_leads_on_all_three(
    cluster: LocalCluster, vhost: str, connection: AbstractConnection, sharded: Topology
) -> None:
    report = await apply_topology(connection, sharded)
    assert report.placed_before == ()
    leaders = cluster.leaders(vhost)
    replicated = replicated_queues(sharded)
    assert set(leaders) == set(replicated)
    counts = per_node(leaders)
    assert len(counts) == 3, counts
    assert max(counts.values()) <= fair_share(len(replicated), 3), counts
    shards = sharded.queue("orders").band_queues(sharded.queue("orders").bands[2])
    assert len({leaders[name] for name in shards}) == 3, {name: leaders[name] for name in shards}

    report_ = await check_broker(connection, sharded, cluster.nodes[0].management_url, vhost=vhost)
    codes = {finding.code: finding for finding in report_.findings}
    assert "leader_skew" not in codes
    assert "shard_leaders_shared" not in codes
    assert f"leaders of {len(replicated)} replicated queues per node" in codes["leaders"].message


async def test_a_sharded_bands_traffic_reaches_a_leader_on_every_node(
    cluster: LocalCluster, vhost: str, connection: AbstractConnection, sharded: Topology
) -> None:
    await apply_topology(connection, sharded)
    orders = sharded.queue("orders")
    shards = orders.band_queues(orders.bands[2])
    url = cluster.nodes[0].amqp_url.rstrip("/") + "/" + quote(vhost, safe="")
    async with Producer.connect(url, topology=sharded) as producer:
        for n in range(300):
            await producer.publish("orders", {"n": n}, priority=1, partition_key=f"customer-{n}")
    leaders = cluster.leaders(vhost)
    held = {name: await ready(connection, name) for name in shards}
    assert sum(held.values()) == 300
    # Each shard got its share of the keys (a third each, give or take the hash ring's
    # unevenness), and each is led by a different node: every node's leader takes writes.
    assert min(held.values()) >= 50, held
    assert {leaders[name] for name in shards} == {node.node for node in cluster.nodes}


async def test_an_older_deployment_is_spread_by_a_rebalance_without_losing_a_message(
    cluster: LocalCluster, vhost: str, connection: AbstractConnection, sharded: Topology
) -> None:
    # What an older bandgate declared: no leader locator, so every leader on the first node.
    channel = await connection.channel()
    for decl in plan(sharded).queues:
        arguments = cast(Arguments, dict(decl.without_placement().arguments))
        await channel.declare_queue(decl.name, durable=True, arguments=arguments)
    first = cluster.nodes[0].node
    assert set(per_node(cluster.leaders(vhost))) == {first}

    # Today's code applies over it: nothing refused, the old queues kept as they are.
    report = await apply_topology(connection, sharded)
    assert set(report.placed_before) == set(replicated_queues(sharded))
    await apply_topology(connection, sharded)  # and again, as every gateway start does

    management = cluster.nodes[0].management_url
    before = await check_broker(connection, sharded, management, vhost=vhost)
    codes = {finding.code for finding in before.findings}
    assert {"leader_skew", "shard_leaders_shared", "leaders_not_placed"} <= codes
    assert not before.errors

    hot = naming.band_queue("orders", "hot")
    publisher = await connection.channel(publisher_confirms=True)
    for n in range(50):
        await publisher.default_exchange.publish(
            aio_pika.Message(str(n).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key=hot,
        )

    cluster.nodes[0].ctl("rebalance", "all", program=QUEUES, timeout=300)

    counts = per_node(cluster.leaders(vhost))
    assert len(counts) == 3, counts
    assert max(counts.values()) <= fair_share(len(replicated_queues(sharded)), 3), counts
    after = await check_broker(connection, sharded, management, vhost=vhost)
    assert "leader_skew" not in {finding.code for finding in after.findings}
    assert await ready(connection, hot) == 50


async def ready(connection: AbstractConnection, queue: str) -> int:
    channel = await connection.channel()
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    await channel.close()
    return int(count or 0)

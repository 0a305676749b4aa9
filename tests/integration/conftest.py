from __future__ import annotations

import gc
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractConnection, AbstractRobustConnection

from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology import naming
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tools.local_cluster import LocalCluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A three-node local cluster of private nodes, for one test."""
    local = LocalCluster(tmp_path)
    try:
        yield local.start()
    finally:
        local.stop()


@pytest.fixture(autouse=True)
def _release_what_a_failed_test_holds() -> Iterator[None]:
    """Once a test failed, free what its frames still hold, within its own teardown.

    pytest keeps a failed test's exception (`sys.last_value`, for post-mortem debugging) until
    the next test's call, and with it every frame it passed through: a connection or socket
    that only the failed test's locals still reach would be finalized during that next test,
    and its ResourceWarning (an error here) would fail it too. Freed here, the warning fails
    the teardown of the test that leaked it. Set up before the test's other fixtures, this runs
    after their teardowns, so their own cleanup comes first."""
    yield
    if getattr(sys, "last_value", None) is not None:  # this test's call failed
        del sys.last_type, sys.last_value, sys.last_traceback
        gc.collect()  # the exception and its frames hold each other in a cycle


@pytest.fixture
def gateway_settings(broker: TestBroker, amqp_url: str) -> GatewaySettings:
    return GatewaySettings(
        amqp_url=amqp_url,
        management_url=broker.management_url,
        publish_timeout_seconds=5.0,
        max_body_bytes=64 * 1024,
        max_batch_messages=20,
        auth_enabled=False,
    )


@pytest.fixture
async def client(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client of a gateway whose lifespan is running (topology applied)."""
    app = create_app(gateway_settings, topology)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            yield http


@pytest.fixture
async def amqp(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    """A plain AMQP connection to the test's vhost, for looking at what the broker holds."""
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        yield connection


async def queue_depths(connection: AbstractConnection, topology: Topology) -> dict[str, int]:
    """Ready messages in every queue the topology declares (bands, DLQs, delay levels)."""
    names = [
        naming.band_queue(spec.name, band.name)
        for spec in topology.queues.values()
        for band in spec.bands
    ]
    names += [naming.dead_letter_queue(name) for name in topology.queues]
    names += [naming.delay_level(topology.exchange, k) for k in range(topology.ladder.levels)]
    channel = await connection.channel()
    depths = {}
    for name in names:
        queue = await channel.declare_queue(name, passive=True)
        depths[name] = queue.declaration_result.message_count or 0
    await channel.close()
    return depths

"""Gateway and workers refuse to start on a broker whose objects would lose or loop messages."""

from __future__ import annotations

import aio_pika
import pytest

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.gateway.app import create_app
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.broker_report import BrokerCheckError
from bandgate.topology.model import Topology

pytestmark = pytest.mark.integration


@pytest.fixture
async def classic_hot_band(amqp_url: str) -> None:
    """`orders.hot` already exists as a classic queue: the topology wants quorum."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue("orders.hot", durable=True)


@pytest.mark.usefixtures("classic_hot_band")
async def test_worker_refuses_a_conflicting_band(amqp_url: str, topology: Topology) -> None:
    app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=topology)

    @app.consumer("orders")
    async def handle(msg: Message) -> None:
        raise AssertionError("must not run")

    with pytest.raises(BrokerCheckError, match="orders.hot"):
        await Worker(app).run()


@pytest.mark.usefixtures("classic_hot_band")
async def test_gateway_refuses_a_conflicting_band(
    gateway_settings: GatewaySettings, topology: Topology
) -> None:
    app = create_app(gateway_settings, topology)
    with pytest.raises(BrokerCheckError, match="orders.hot"):
        async with app.router.lifespan_context(app):
            pass

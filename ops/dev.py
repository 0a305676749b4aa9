"""`bandgate dev`: everything a developer needs on one machine, in one command.

Without `BANDGATE_AMQP_URL` it starts a private RabbitMQ node from the installed
`rabbitmq-server` (data kept under `.bandgate/`), enables the management UI, applies the
topology, serves the gateway, and stops the node cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from types import FrameType

import aio_pika
import uvicorn
from rich.console import Console

from bandgate.gateway.http_server import server_options
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import LocalBroker, free_port, port_open
from bandgate.pull.app import create_app
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Topology

log = logging.getLogger(__name__)

DEV_DIR = Path(".bandgate")
DEV_PORTS = {"amqp": 5682, "management": 15682, "dist": 25682}


def _port(preferred: int) -> int:
    return preferred if not port_open(preferred) else free_port()


def dev_broker(base: Path = DEV_DIR) -> LocalBroker:
    return LocalBroker(
        base_dir=(base / "rabbitmq").resolve(),
        name="bandgate-dev",
        amqp_port=_port(DEV_PORTS["amqp"]),
        management_port=_port(DEV_PORTS["management"]),
        dist_port=_port(DEV_PORTS["dist"]),
    )


async def _apply(settings: GatewaySettings, topology: Topology) -> str:
    connection = await aio_pika.connect(
        settings.amqp_url, client_properties={"connection_name": naming.CLI_CONNECTION}
    )
    async with connection:
        management = (
            ManagementClient(settings.management_url, vhost_of(settings.amqp_url))
            if settings.management_url
            else None
        )
        report = await apply_topology(connection, topology, management)
    return report.broker_version


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_dev(host: str, port: int) -> None:
    console = Console()
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it; turning it into SystemExit
    # lets the `finally` below stop the node instead of leaving it running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    node: LocalBroker | None = None
    if not os.environ.get("BANDGATE_AMQP_URL"):
        node = dev_broker()
        console.print(
            f"starting a private RabbitMQ node [bold]{node.node}[/] (data in {node.base_dir})"
        )
        node.start()
        os.environ["BANDGATE_AMQP_URL"] = node.amqp_url
        os.environ.setdefault("BANDGATE_MANAGEMENT_URL", node.management_url)
    try:
        # The topology was just applied; the gateway need not declare it again.
        settings = GatewaySettings(host=host, port=port, declare_topology=False, auth_enabled=False)
        topology = settings.load_topology()
        version = asyncio.run(_apply(settings, topology))
        console.print(
            f"topology applied on RabbitMQ {version}: queues {', '.join(topology.queues)}"
        )
        console.print(
            f"  gateway        http://{host}:{port}  (try POST /v1/queues/orders/messages)"
        )
        console.print(f"  console        http://{host}:{port}/console")
        console.print(f"  AMQP           {settings.amqp_url}")
        if settings.management_url:
            mgmt = settings.management_url.replace("guest:guest@", "")
            console.print(f"  management UI  {mgmt}  (guest / guest)")
        console.print("  authentication is OFF for local development (bandgate gateway has it on)")
        console.print("  Ctrl-C stops the gateway" + (" and the node" if node else ""))
        app = create_app(settings, topology)
        uvicorn.run(app, **server_options(settings))
    finally:
        if node is not None:
            console.print(f"stopping RabbitMQ node {node.node}")
            node.stop()

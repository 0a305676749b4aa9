"""`bandgate dev`: everything a developer needs on one machine, in one command.

Without `BANDGATE_AMQP_URL` it starts a private RabbitMQ node from the installed
`rabbitmq-server` (data kept under `.bandgate/`), enables the management UI, applies the
topology, serves the gateway, and stops the node cleanly on Ctrl-C or SIGTERM. It starts again
over the same data however the last run ended (Ctrl-C, its node killed, itself killed), and it
records where its broker and gateway are in `.bandgate/dev.json`, which every other command
run here reads when no broker is set (`topology.dev_record`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import signal
from pathlib import Path
from types import FrameType

import uvicorn
from rich.console import Console

from bandgate.core import cluster_connection
from bandgate.gateway.cross_site import local_hosts
from bandgate.gateway.http_server import server_options
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import (
    LocalBroker,
    LocalBrokerError,
    free_port,
    port_open,
    stop_left_running,
)
from bandgate.pull.app import create_app
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.dev_record import DevRecord, read_record, record_path, write_record
from bandgate.topology.loader import TopologyError
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Topology
from bandgate.topology.settings import AMQP_URL_ENV, redact

log = logging.getLogger(__name__)

DEV_DIR = Path(".bandgate")
DEV_PORTS = {"amqp": 5682, "management": 15682, "dist": 25682}


class DevError(RuntimeError):
    """`bandgate dev` cannot start: one line says why and what to do."""


def _port(preferred: int) -> int:
    return preferred if not port_open(preferred) else free_port()


def dev_node_name(base_dir: Path) -> str:
    """One node name per data directory: Erlang allows one node of a name per machine, so
    two checkouts (or the README test beside a developer's `make run`) would collide."""
    digest = hashlib.sha256(str(base_dir).encode()).hexdigest()[:8]
    return f"bandgate-dev-{digest}"


def dev_broker(base: Path = DEV_DIR) -> LocalBroker:
    base_dir = (base / "rabbitmq").resolve()
    return LocalBroker(
        base_dir=base_dir,
        name=dev_node_name(base_dir),
        amqp_port=_port(DEV_PORTS["amqp"]),
        management_port=_port(DEV_PORTS["management"]),
        dist_port=_port(DEV_PORTS["dist"]),
    )


def _check_previous(previous: DevRecord | None, console: Console) -> None:
    """Refuse a second `bandgate dev` here; stop a node that a killed one left running."""
    if previous is None:
        return
    if previous.running:
        raise DevError(
            f"bandgate dev already runs here (pid {previous.dev_pid}, gateway "
            f"{previous.gateway_url}): use it, or stop it first"
        )
    if previous.node_pid is not None and stop_left_running(previous.node_pid):
        console.print(f"stopped the RabbitMQ node {previous.node} that an earlier run left running")


async def _apply(settings: GatewaySettings, topology: Topology) -> str:
    connection = await cluster_connection.connect(
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


def _apply_or_explain(settings: GatewaySettings, topology: Topology) -> str:
    try:
        return asyncio.run(_apply(settings, topology))
    except TopologyError as exc:
        raise DevError(str(exc)) from None
    except cluster_connection.CONNECT_ERRORS as exc:
        raise DevError(
            f"cannot apply the topology at RabbitMQ {settings.describe_broker()}: {exc}"
        ) from None


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def run_dev(host: str, port: int) -> None:
    console = Console()
    try:
        _run(console, host, port)
    except (DevError, LocalBrokerError) as exc:
        Console(stderr=True, highlight=False).print(f"error: {exc}", markup=False)
        raise SystemExit(1) from None


def _run(console: Console, host: str, port: int) -> None:
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it; turning it into SystemExit
    # lets the `finally` below stop the node instead of leaving it running.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    base = Path.cwd()
    _check_previous(read_record(record_path(base)), console)
    node: LocalBroker | None = None
    if not os.environ.get(AMQP_URL_ENV):
        node = dev_broker()
        console.print(
            f"starting a private RabbitMQ node [bold]{node.node}[/] (data in {node.base_dir})"
        )
        node.start()
        os.environ[AMQP_URL_ENV] = node.amqp_url
        os.environ.setdefault("BANDGATE_MANAGEMENT_URL", node.management_url)
    record = DevRecord(
        amqp_url=os.environ[AMQP_URL_ENV],
        management_url=os.environ.get("BANDGATE_MANAGEMENT_URL"),
        gateway_url=f"http://{host}:{port}",
        node=node.node if node else None,
        dev_pid=os.getpid(),
        node_pid=node.process.pid if node and node.process else None,
    )
    write_record(base, record)
    try:
        _serve(console, host, port, record)
    finally:
        if node is not None:
            console.print(f"stopping RabbitMQ node {node.node}")
            node.stop()
        write_record(base, dataclasses.replace(record, dev_pid=None, node_pid=None))


def _serve(console: Console, host: str, port: int, record: DevRecord) -> None:
    # The topology is applied here; the gateway need not declare it again.
    settings = GatewaySettings(host=host, port=port, declare_topology=False, auth_enabled=False)
    if not settings.allowed_hosts:
        # Authentication is off: no page may reach this gateway through a name of its own
        # (DNS rebinding); cross-site requests are refused anyway (`gateway.cross_site`).
        settings = settings.model_copy(update={"allowed_hosts": local_hosts(host)})
    topology = settings.load_topology()
    version = _apply_or_explain(settings, topology)
    console.print(f"topology applied on RabbitMQ {version}: queues {', '.join(topology.queues)}")
    console.print(f"  gateway        {record.gateway_url}  (try POST /v1/queues/orders/messages)")
    console.print(f"  console        {record.gateway_url}/console")
    console.print(f"  AMQP           {redact(settings.amqp_url)}")
    if settings.management_url:
        mgmt = settings.management_url.replace("guest:guest@", "")
        console.print(f"  management UI  {mgmt}  (guest / guest)")
    console.print(
        f"  other commands run in {Path.cwd()} use this broker ({record_path(Path('.'))})"
    )
    console.print("  authentication is OFF for local development (bandgate gateway has it on)")
    console.print("  Ctrl-C stops the gateway" + (" and the node" if record.node else ""))
    app = create_app(settings, topology)
    uvicorn.run(app, **server_options(settings))

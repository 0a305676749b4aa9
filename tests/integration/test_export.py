"""The exported definitions and `bandgate topology apply` put the same objects on a broker."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aio_pika
import httpx
import pytest
from typer.testing import CliRunner

from bandgate.ops.local_broker import LocalBroker, free_port, quorum_wal_setting
from bandgate.ops.topology_cli import app
from bandgate.topology import export
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import load_topology, parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.objects import plan
from tests.broker import TestBroker

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_TOPOLOGY = ROOT / "bandgate.toml"
RABBITMQ_DIR = ROOT / "rabbitmq"


def broker_objects(api: httpx.Client, vhost: str) -> dict[str, Any]:
    """What the management API lists in `vhost`, without the vhost name and statistics."""
    encoded = quote(vhost, safe="")

    def listing(kind: str) -> list[dict[str, Any]]:
        response = api.get(f"/api/{kind}/{encoded}")
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result

    queues = {
        q["name"]: {key: q.get(key) for key in ("type", "durable", "auto_delete", "arguments")}
        for q in listing("queues")
    }
    exchanges = {
        e["name"]: {
            key: e.get(key) for key in ("type", "durable", "auto_delete", "internal", "arguments")
        }
        for e in listing("exchanges")
    }
    fields = ("source", "destination", "destination_type", "routing_key", "arguments")
    bindings = sorted(
        (tuple(str(b[key]) for key in fields) for b in listing("bindings")),
    )
    return {"queues": queues, "exchanges": exchanges, "bindings": bindings}


def import_definitions(api: httpx.Client, vhost: str, topology: Topology) -> None:
    document = export.definitions(topology, vhost)
    response = api.post(f"/api/definitions/{quote(vhost, safe='')}", json=document)
    assert response.status_code in (200, 201, 204), response.text


def assert_same_objects(imported: dict[str, Any], applied: dict[str, Any], topo: Topology) -> None:
    objects = plan(topo)
    ours = {queue.name for queue in objects.queues}
    assert ours <= set(applied["queues"])
    assert {exchange.name for exchange in objects.exchanges} <= set(applied["exchanges"])
    assert imported["queues"] == applied["queues"]
    assert imported["exchanges"] == applied["exchanges"]
    assert imported["bindings"] == applied["bindings"]
    # Every planned binding is there (the rest are the default exchange's, one per queue).
    assert len(applied["bindings"]) == len(objects.bindings) + len(ours)


def test_imported_definitions_match_cli_apply(broker: TestBroker, amqp_url: str) -> None:
    shipped = load_topology(SHIPPED_TOPOLOGY)
    result = CliRunner().invoke(
        app, ["apply", "--topology", str(SHIPPED_TOPOLOGY), "--amqp-url", amqp_url]
    )
    assert result.exit_code == 0, result.output
    assert "Applied" in result.stdout
    applied_vhost = amqp_url.rsplit("/", 1)[1]
    with broker.fresh_vhost() as imported_vhost, broker.management() as api:
        import_definitions(api, imported_vhost, shipped)
        imported = broker_objects(api, imported_vhost)
        applied = broker_objects(api, applied_vhost)
    assert_same_objects(imported, applied, shipped)
    assert imported["queues"]["emails.cold"]["arguments"]["x-max-priority"] == 4
    assert imported["queues"]["orders.warm"]["arguments"]["x-message-ttl"] == 600_000


async def _apply(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)


def test_imported_definitions_match_apply_topology(
    broker: TestBroker, amqp_url: str, topology: Topology
) -> None:
    asyncio.run(_apply(amqp_url, topology))
    applied_vhost = amqp_url.rsplit("/", 1)[1]
    with broker.fresh_vhost() as imported_vhost, broker.management() as api:
        import_definitions(api, imported_vhost, topology)
        imported = broker_objects(api, imported_vhost)
        applied = broker_objects(api, applied_vhost)
    assert_same_objects(imported, applied, topology)


def test_sharded_and_ordered_bands_import_as_they_apply(broker: TestBroker, amqp_url: str) -> None:
    """Hash exchanges with their hash-header, exchange-to-exchange bindings, shard weights."""
    sharded = parse_topology(
        {
            "delay": {"levels": 3},
            "queues": {
                "orders": {
                    "ordered": True,
                    "bands": [
                        {"name": "hot", "priorities": [5, 9], "shards": 2},
                        {"name": "cold", "priorities": [0, 4], "shards": 3},
                    ],
                },
                "commands": {"ordering_required": True},
            },
        }
    )
    asyncio.run(_apply(amqp_url, sharded))
    applied_vhost = amqp_url.rsplit("/", 1)[1]
    with broker.fresh_vhost() as imported_vhost, broker.management() as api:
        import_definitions(api, imported_vhost, sharded)
        imported = broker_objects(api, imported_vhost)
        applied = broker_objects(api, applied_vhost)
    assert_same_objects(imported, applied, sharded)
    hashing = imported["exchanges"]["bandgate.shards.orders.cold"]
    assert hashing["type"] == "x-consistent-hash"
    assert hashing["arguments"] == {"hash-header": "x-bandgate-shard-key"}
    assert imported["queues"]["orders.cold.2"]["arguments"]["x-single-active-consumer"] is True
    assert ("bandgate", "bandgate.shards.orders.cold", "exchange", "orders.3", "{}") in (
        imported["bindings"]
    )


def test_apply_conflict_exits_1_with_the_difference(broker: TestBroker, amqp_url: str) -> None:
    runner = CliRunner()
    args = ["apply", "--topology", str(SHIPPED_TOPOLOGY), "--amqp-url", amqp_url]
    assert runner.invoke(app, args).exit_code == 0
    vhost = quote(amqp_url.rsplit("/", 1)[1], safe="")
    with broker.management() as api:
        api.delete(f"/api/queues/{vhost}/orders.warm").raise_for_status()
        api.put(f"/api/queues/{vhost}/orders.warm", json={"durable": True}).raise_for_status()

    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    assert result.stderr.startswith("error: queue 'orders.warm' exists with other settings: ")
    assert "Traceback" not in result.output
    assert "PRECONDITION_FAILED" not in result.output

    detailed = runner.invoke(app, [*args, "--management-url", broker.management_url])
    assert detailed.exit_code == 1
    assert "x-queue-type is 'classic' on the broker, the topology wants 'quorum'" in (
        detailed.stderr
    )
    assert "x-message-ttl is not set on the broker, the topology wants 600000" in detailed.stderr


@dataclass
class BootedBroker(LocalBroker):
    """A private node configured by the committed rabbitmq/ files, ports, paths and the WAL
    setting's key (the session's version may not be the compose image's) aside."""

    prometheus_port: int = 0

    def _write_config(self) -> None:
        super()._write_config()
        self.prometheus_port = free_port()
        local = {
            "listeners.tcp.default": f"127.0.0.1:{self.amqp_port}",
            "management.tcp.port": str(self.management_port),
            "prometheus.tcp.port": str(self.prometheus_port),
            "load_definitions": str(RABBITMQ_DIR / "definitions.json"),
        }
        lines = []
        for line in (RABBITMQ_DIR / "rabbitmq.conf").read_text().splitlines():
            match = re.match(r"^\s*([\w.]+)\s*=", line)
            if match and match[1] in local:
                line = f"{match[1]} = {local[match[1]]}"
            elif match and match[1].endswith(".wal_max_size_bytes"):
                # Named as the compose image's version takes it; a node of another version
                # refuses a key it does not know, so it gets its own key, at the same size.
                line = quorum_wal_setting(self.root, int(line.partition("=")[2]))
            lines.append(line)
        lines += ["management.tcp.ip = 127.0.0.1", "prometheus.tcp.ip = 127.0.0.1"]
        (self.base_dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        plugins = (RABBITMQ_DIR / "enabled_plugins").read_text()
        (self.base_dir / "enabled_plugins").write_text(plugins)


@pytest.fixture
def booted(tmp_path: Path) -> Iterator[BootedBroker]:
    node = BootedBroker(tmp_path / "node", name=f"bandgate-boot-{uuid.uuid4().hex[:6]}")
    node.start()
    try:
        yield node
    finally:
        node.kill()  # a throwaway node: a graceful stop of 40 quorum queues takes ~12 s


def test_a_node_booted_with_the_committed_files_holds_the_topology(
    broker: TestBroker, amqp_url: str, booted: BootedBroker
) -> None:
    """docker-compose's broker: rabbitmq.conf loads definitions.json at boot."""
    login = (export.DEV_USER, export.DEV_PASSWORD)
    base = f"http://127.0.0.1:{booted.management_port}"
    with httpx.Client(base_url=base, auth=login, timeout=30) as api:
        users = [user["name"] for user in api.get("/api/users").raise_for_status().json()]
        # Loading definitions at boot skips the default user: the file's login is the only one.
        assert users == [export.DEV_USER]
        booted_objects = broker_objects(api, "/")

        # `apply` as the file's login finds everything in place: no conflict, nothing added.
        dev_url = f"amqp://{export.DEV_USER}:{export.DEV_PASSWORD}@127.0.0.1:{booted.amqp_port}/"
        result = CliRunner().invoke(
            app, ["apply", "--topology", str(SHIPPED_TOPOLOGY), "--amqp-url", dev_url]
        )
        assert result.exit_code == 0, result.output
        assert broker_objects(api, "/") == booted_objects

    metrics = httpx.get(f"http://127.0.0.1:{booted.prometheus_port}/metrics", timeout=30)
    assert metrics.status_code == 200

    shipped = load_topology(SHIPPED_TOPOLOGY)
    asyncio.run(_apply(amqp_url, shipped))
    with broker.management() as api:
        applied = broker_objects(api, amqp_url.rsplit("/", 1)[1])
    assert_same_objects(booted_objects, applied, shipped)

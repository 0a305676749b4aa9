"""definitions.json: built from the plan, deterministic, and committed up to date."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from bandgate.topology import export
from bandgate.topology.loader import load_topology, parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.objects import plan

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "rabbitmq" / "definitions.json"
REGENERATE = "bandgate topology export --dev-user --output rabbitmq/definitions.json"


@pytest.fixture
def shipped() -> Topology:
    return load_topology(ROOT / "bandgate.toml")


def test_the_committed_definitions_are_a_fresh_export_of_bandgate_toml(shipped: Topology) -> None:
    fresh = export.to_json(export.definitions(shipped, dev_user=True))
    committed = COMMITTED.read_text(encoding="utf-8")
    assert committed == fresh, f"rabbitmq/definitions.json is stale: run `{REGENERATE}`"


def test_exactly_the_planned_objects_are_exported(shipped: Topology) -> None:
    objects = plan(shipped)
    document = export.definitions(shipped)
    assert {e["name"]: e["type"] for e in document["exchanges"]} == {
        e.name: e.type for e in objects.exchanges
    }
    assert {q["name"]: dict(q["arguments"]) for q in document["queues"]} == {
        q.name: dict(q.arguments) for q in objects.queues
    }
    exported = [
        (b["source"], b["destination"], b["routing_key"], b["destination_type"])
        for b in document["bindings"]
    ]
    assert sorted(exported) == sorted(
        (b.source, b.destination, b.routing_key, b.destination_type) for b in objects.bindings
    )
    assert len(exported) == len(set(exported))


def test_objects_are_durable_and_plain(shipped: Topology) -> None:
    document = export.definitions(shipped)
    for exchange in document["exchanges"]:
        assert (exchange["durable"], exchange["auto_delete"], exchange["internal"]) == (
            True,
            False,
            False,
        )
        assert exchange["arguments"] == {}
    for queue in document["queues"]:
        assert (queue["durable"], queue["auto_delete"]) == (True, False)
    assert all(binding["arguments"] == {} for binding in document["bindings"])


def test_the_vhost_is_declared_and_used_everywhere(shipped: Topology) -> None:
    document = export.definitions(shipped, "staging")
    assert document["vhosts"] == [{"name": "staging"}]
    entries = [*document["exchanges"], *document["queues"], *document["bindings"]]
    assert {entry["vhost"] for entry in entries} == {"staging"}


def test_no_login_unless_asked(shipped: Topology) -> None:
    document = export.definitions(shipped)
    assert document["users"] == []
    assert document["permissions"] == []
    assert document["policies"] == []


def test_the_dev_user_is_a_rabbitmq_sha256_hash_of_its_password(shipped: Topology) -> None:
    document = export.definitions(shipped, "/", dev_user=True)
    (user,) = document["users"]
    assert user["name"] == export.DEV_USER != "guest"
    assert user["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    assert user["tags"] == "administrator"
    raw = base64.b64decode(user["password_hash"])
    salt, digest = raw[:4], raw[4:]
    assert digest == hashlib.sha256(salt + export.DEV_PASSWORD.encode()).digest()
    assert document["permissions"] == [
        {"user": export.DEV_USER, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
    ]


def test_the_export_is_deterministic(shipped: Topology) -> None:
    first = export.to_json(export.definitions(shipped, dev_user=True))
    assert first == export.to_json(export.definitions(shipped, dev_user=True))
    assert first.endswith("}\n")
    assert first == json.dumps(json.loads(first), indent=2, sort_keys=True) + "\n"


def test_lists_are_sorted_so_queue_order_in_the_file_does_not_matter() -> None:
    queues = {
        "orders": {},
        "emails": {
            "bands": [
                {"name": "hot", "priorities": [5, 9]},
                {"name": "cold", "priorities": [0, 4], "type": "classic"},
            ]
        },
    }
    forward = parse_topology({"delay": {"levels": 4}, "queues": queues})
    backward = parse_topology({"delay": {"levels": 4}, "queues": dict(reversed(queues.items()))})
    assert list(forward.queues) != list(backward.queues)
    document = export.definitions(forward)
    assert export.to_json(document) == export.to_json(export.definitions(backward))
    names = [queue["name"] for queue in document["queues"]]
    assert names == sorted(names)
    exchanges = [exchange["name"] for exchange in document["exchanges"]]
    assert exchanges == sorted(exchanges)


def test_the_export_is_a_copy_of_the_plan(shipped: Topology) -> None:
    document = export.definitions(shipped)
    document["queues"][0]["arguments"]["x-message-ttl"] = 1
    assert export.definitions(shipped)["queues"][0]["arguments"].get("x-message-ttl") != 1


def test_the_broker_config_loads_the_committed_definitions() -> None:
    conf = (ROOT / "rabbitmq" / "rabbitmq.conf").read_text(encoding="utf-8")
    settings: dict[str, str] = {}
    for line in conf.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    assert settings["load_definitions"] == "/etc/rabbitmq/definitions.json"
    assert settings["management.tcp.port"] == "15672"
    assert settings["listeners.tcp.default"] == "5672"
    plugins = (ROOT / "rabbitmq" / "enabled_plugins").read_text(encoding="utf-8")
    assert plugins == (
        "[rabbitmq_management,rabbitmq_prometheus,rabbitmq_consistent_hash_exchange].\n"
    )

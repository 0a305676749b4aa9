"""`objects.plan()`: the exchanges, queues and bindings a topology needs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from topology import naming
from topology.loader import load_topology, parse_topology
from topology.model import Topology
from topology.objects import BindingDecl, Plan, QueueDecl, plan
from topology.priority import MAX_PRIORITY, MIN_PRIORITY

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def topology() -> Topology:
    return parse_topology(
        {
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {
                    "bands": [
                        {"name": "hot", "priorities": [7, 9]},
                        {"name": "warm", "priorities": [4, 6], "age_after_seconds": 600},
                        {"name": "cold", "priorities": [0, 3], "age_after_seconds": 1800.5},
                    ]
                },
                "emails": {
                    "bands": [
                        {"name": "hot", "priorities": [5, 9], "max_length": 1000},
                        {"name": "cold", "priorities": [0, 4], "type": "classic"},
                    ]
                },
            },
        }
    )


@pytest.fixture(scope="module")
def objects(topology: Topology) -> Plan:
    return plan(topology)


def queue(objects: Plan, name: str) -> QueueDecl:
    (found,) = [q for q in objects.queues if q.name == name]
    return found


def bindings_from(objects: Plan, source: str) -> list[BindingDecl]:
    return [b for b in objects.bindings if b.source == source]


def test_names_are_unique_and_bindings_connect_planned_objects(objects: Plan) -> None:
    exchanges = [e.name for e in objects.exchanges]
    queues = [q.name for q in objects.queues]
    assert len(set(exchanges)) == len(exchanges)
    assert len(set(queues)) == len(queues)
    assert len(set(objects.bindings)) == len(objects.bindings)
    for binding in objects.bindings:
        assert binding.source in exchanges
        targets = queues if binding.destination_type == "queue" else exchanges
        assert binding.destination in targets


def test_exchanges(objects: Plan) -> None:
    kinds = {e.name: e.type for e in objects.exchanges}
    assert kinds["bandgate"] == "topic"
    assert kinds["bandgate.dead"] == "direct"
    assert kinds["bandgate.delay.out"] == "topic"
    assert [kinds[naming.delay_level("bandgate", k)] for k in range(12)] == ["topic"] * 12
    assert len(kinds) == 3 + 12


def test_quorum_bands_have_no_max_priority(objects: Plan) -> None:
    for name in ("orders.hot", "orders.warm", "orders.cold", "emails.hot"):
        args = queue(objects, name).arguments
        assert args["x-queue-type"] == "quorum"
        assert "x-max-priority" not in args
        # At-least-once dead-lettering needs reject-publish; quorum queues support both.
        assert args["x-dead-letter-strategy"] == "at-least-once"
        assert args["x-overflow"] == "reject-publish"


def test_classic_bands_order_by_priority_inside(objects: Plan) -> None:
    args = queue(objects, "emails.cold").arguments
    assert args["x-queue-type"] == "classic"
    assert args["x-max-priority"] == 4
    assert "x-dead-letter-strategy" not in args


def test_max_length_is_declared(objects: Plan) -> None:
    assert queue(objects, "emails.hot").arguments["x-max-length"] == 1000
    assert "x-max-length" not in queue(objects, "orders.hot").arguments


def test_aging_dead_letters_into_the_band_above(objects: Plan) -> None:
    for band, ttl, above in (("warm", 600_000, "orders.hot"), ("cold", 1_800_500, "orders.warm")):
        args = queue(objects, f"orders.{band}").arguments
        assert args["x-message-ttl"] == ttl
        assert args["x-dead-letter-exchange"] == "bandgate"
        key = args["x-dead-letter-routing-key"]
        (binding,) = [b for b in bindings_from(objects, "bandgate") if b.routing_key == key]
        assert binding.destination == above


def test_bands_without_aging_dead_letter_into_the_queue_dlq(objects: Plan) -> None:
    for name, logical in (
        ("orders.hot", "orders"),
        ("emails.hot", "emails"),
        ("emails.cold", "emails"),
    ):
        args = queue(objects, name).arguments
        assert "x-message-ttl" not in args
        assert args["x-dead-letter-exchange"] == "bandgate.dead"
        assert args["x-dead-letter-routing-key"] == logical
    dead = {b.routing_key: b.destination for b in bindings_from(objects, "bandgate.dead")}
    assert dead == {"orders": "orders.dlq", "emails": "emails.dlq"}
    assert queue(objects, "orders.dlq").arguments == {"x-queue-type": "quorum"}


@pytest.mark.parametrize("source", ["bandgate", "bandgate.delay.out"])
def test_every_priority_is_bound_exactly_once_per_queue(
    topology: Topology, objects: Plan, source: str
) -> None:
    for spec in topology.queues.values():
        keys = Counter(
            b.routing_key
            for b in bindings_from(objects, source)
            if b.destination.startswith(f"{spec.name}.")
        )
        if source == "bandgate":
            expected = [naming.routing_key(spec.name, p) for p in range(10)]
        else:
            expected = [naming.delay_exit_pattern(spec.name, p) for p in range(10)]
        assert sorted(keys) == sorted(expected)
        assert set(keys.values()) == {1}
        for priority in range(MIN_PRIORITY, MAX_PRIORITY + 1):
            band = spec.band_for(priority)
            key = expected[priority]
            (binding,) = [b for b in bindings_from(objects, source) if b.routing_key == key]
            assert binding.destination == naming.band_queue(spec.name, band.name)


def test_each_delay_level_holds_its_ttl_and_passes_on(topology: Topology, objects: Plan) -> None:
    ladder = topology.ladder
    for level in range(ladder.levels):
        name = naming.delay_level("bandgate", level)
        args = queue(objects, name).arguments
        assert args == {
            "x-queue-type": "quorum",
            "x-message-ttl": 50 * 2**level,
            "x-overflow": "reject-publish",
            "x-dead-letter-exchange": ladder.next_hop(level),
            "x-dead-letter-strategy": "at-least-once",
        }
        assert sorted(bindings_from(objects, name), key=lambda b: b.routing_key) == [
            BindingDecl(name, ladder.next_hop(level), ladder.bit_pattern(level, "0"), "exchange"),
            BindingDecl(name, name, ladder.bit_pattern(level, "1"), "queue"),
        ]


def test_the_shipped_topology_plan_counts() -> None:
    objects = plan(load_topology(ROOT / "bandgate.toml"))
    # main, dead, delay exit, 33 levels; 33 level queues + 5 bands + 2 DLQs;
    # 2 per level, 2 per priority per queue (main and delay exit), 1 per DLQ.
    assert (len(objects.exchanges), len(objects.queues), len(objects.bindings)) == (
        36,
        40,
        33 * 2 + 2 * 10 * 2 + 2,
    )


def test_names_that_look_like_bandgate_objects_do_not_collide() -> None:
    tricky = parse_topology(
        {
            "delay": {"levels": 3},
            "queues": {
                "bandgate": {
                    "bands": [
                        {"name": "delay", "priorities": [5, 9]},
                        {"name": "dead", "priorities": [0, 4]},
                    ]
                },
            },
        }
    )
    objects = plan(tricky)
    names = [q.name for q in objects.queues]
    assert len(set(names)) == len(names)

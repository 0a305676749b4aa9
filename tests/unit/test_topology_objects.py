"""`objects.plan()`: the exchanges, queues and bindings a topology needs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology, parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.objects import BindingDecl, Plan, QueueDecl, band_arguments, plan
from bandgate.topology.priority import MAX_PRIORITY, MIN_PRIORITY

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
    assert kinds["zz.bandgate.delay.out"] == "topic"
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
    assert queue(objects, "orders.dlq").arguments == {
        "x-queue-type": "quorum",
        "x-queue-leader-locator": "balanced",
    }


@pytest.mark.parametrize("source", ["bandgate", "zz.bandgate.delay.out"])
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
            "x-queue-leader-locator": "balanced",
        }
        assert sorted(bindings_from(objects, name), key=lambda b: b.routing_key) == [
            BindingDecl(name, ladder.next_hop(level), ladder.bit_pattern(level, "0"), "exchange"),
            BindingDecl(name, name, ladder.bit_pattern(level, "1"), "queue"),
        ]


def test_the_shipped_topology_plan_counts() -> None:
    objects = plan(load_topology(ROOT / "bandgate.toml"))
    # main, dead, delay exit, 26 levels; the ledger + 26 level queues + 5 bands + 2 DLQs;
    # 2 per level, 2 per priority per queue (main and delay exit), 1 per DLQ.
    assert (len(objects.exchanges), len(objects.queues), len(objects.bindings)) == (
        29,
        34,
        26 * 2 + 2 * 10 * 2 + 2,
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


SHARDED = parse_topology(
    {
        "delay": {"levels": 3},
        "queues": {
            "orders": {
                "ordered": True,
                "bands": [
                    {"name": "hot", "priorities": [7, 9], "shards": 2},
                    {"name": "warm", "priorities": [4, 6], "age_after_seconds": 60},
                    {"name": "cold", "priorities": [0, 3], "shards": 3, "age_after_seconds": 600},
                ],
            },
            "emails": {"bands": [{"name": "all", "priorities": [0, 9], "shards": 2}]},
            "commands": {"ordering_required": True},
        },
    }
)


def test_a_sharded_band_is_a_hash_exchange_in_front_of_its_shard_queues() -> None:
    objects = plan(SHARDED)
    hashing = naming.shard_exchange("bandgate", "orders", "cold")
    assert hashing == "bandgate.shards.orders.cold"
    [exchange] = [e for e in objects.exchanges if e.name == hashing]
    assert exchange.type == "x-consistent-hash"
    assert exchange.arguments == {"hash-header": wire.SHARD_KEY}
    shards = [f"orders.cold.{i}" for i in range(3)]
    assert bindings_from(objects, hashing) == [BindingDecl(hashing, s, "1") for s in shards]
    # The band's priorities reach the exchange, from the main exchange and the delay exit.
    for source, key in (("bandgate", naming.routing_key), ("zz.bandgate.delay.out", None)):
        into = {b.routing_key for b in bindings_from(objects, source) if b.destination == hashing}
        assert into == {
            key("orders", p) if key else naming.delay_exit_pattern("orders", p) for p in range(4)
        }
        assert all(
            b.destination_type == "exchange"
            for b in bindings_from(objects, source)
            if b.destination == hashing
        )
    # No queue is bound straight from the main exchange for a sharded band.
    assert not any(
        b.destination.startswith("orders.cold") for b in bindings_from(objects, "bandgate")
    )
    assert "orders.cold" not in [q.name for q in objects.queues]


def test_shard_queues_are_band_queues_and_ordered_ones_have_one_active_consumer() -> None:
    objects = plan(SHARDED)
    orders = SHARDED.queue("orders")
    for band in orders.bands:
        expected = band_arguments(SHARDED, orders, band)
        assert expected["x-single-active-consumer"] is True
        for name in orders.band_queues(band):
            assert queue(objects, name).arguments == {
                **expected,
                "x-queue-leader-locator": "balanced",
            }
    cold = queue(objects, "orders.cold.2").arguments
    assert cold["x-message-ttl"] == 600_000  # aging works per shard
    assert cold["x-dead-letter-exchange"] == "bandgate"
    assert cold["x-dead-letter-routing-key"] == "orders.4"
    # Unordered sharded bands are plain competing-consumer queues.
    assert "x-single-active-consumer" not in queue(objects, "emails.all.0").arguments
    assert queue(objects, "commands.all").arguments["x-single-active-consumer"] is True


def test_aging_into_a_sharded_band_goes_through_its_hash_exchange() -> None:
    objects = plan(SHARDED)
    warm = queue(objects, "orders.warm").arguments
    key = warm["x-dead-letter-routing-key"]
    assert (warm["x-dead-letter-exchange"], key) == ("bandgate", "orders.7")
    [binding] = [b for b in bindings_from(objects, "bandgate") if b.routing_key == key]
    assert (binding.destination, binding.destination_type) == (
        "bandgate.shards.orders.hot",
        "exchange",
    )


def test_only_ordered_sharded_queues_get_a_workers_queue() -> None:
    names = [q.name for q in plan(SHARDED).queues]
    assert naming.workers_queue("bandgate", "orders") == "zz.bandgate.workers.orders"
    assert "zz.bandgate.workers.orders" in names
    assert "zz.bandgate.workers.emails" not in names  # sharded, but competing consumers
    assert "zz.bandgate.workers.commands" not in names  # ordered, one queue
    assert queue(plan(SHARDED), "zz.bandgate.workers.orders").arguments == {
        "x-queue-type": "quorum",
        "x-queue-leader-locator": "balanced",
    }
    assert len(set(names)) == len(names)


def test_every_replicated_queue_places_its_leader_on_the_least_busy_node(objects: Plan) -> None:
    """Leaders balanced at declaration (a client-local leader put all 33 on one node), and
    classic queues, which are not replicated, without the argument."""
    for decl in objects.queues:
        placed = decl.arguments.get("x-queue-leader-locator")
        if decl.arguments.get("x-queue-type") in ("quorum", "stream"):
            assert placed == "balanced", decl.name
            assert "x-queue-leader-locator" not in decl.without_placement().arguments
        else:
            assert placed is None, decl.name
    assert queue(objects, "zz.bandgate.ledger").arguments["x-queue-leader-locator"] == "balanced"

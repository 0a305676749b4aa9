"""The binary TTL delay ladder: rounding, routes, bit patterns, limits, and a walk through the
planned exchanges and queues that checks where a delayed message ends up and after how long."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from bandgate.topology import naming
from bandgate.topology.delay import DelayLadder
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.objects import Plan, plan

LADDER = DelayLadder("bandgate", base_ms=50, levels=12)


def test_ttl_doubles_per_level() -> None:
    assert [LADDER.ttl_ms(level) for level in range(4)] == [50, 100, 200, 400]
    assert LADDER.ttl_ms(11) == 50 * 2**11


@pytest.mark.parametrize(
    ("delay_ms", "units"),
    [(0, 0), (24.9, 0), (25, 1), (50, 1), (74.9, 1), (75, 2), (1000, 20), (2000.4, 40)],
)
def test_units_round_to_the_nearest_step(delay_ms: float, units: int) -> None:
    assert LADDER.units(delay_ms) == units


def test_a_negative_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        LADDER.units(-1)


def test_max_delay_is_all_levels_full() -> None:
    assert LADDER.max_delay_ms == 50 * (2**12 - 1)
    assert LADDER.units(LADDER.max_delay_ms) == 2**12 - 1
    assert LADDER.route(LADDER.max_delay_ms, "orders", 1) is not None
    with pytest.raises(ValueError, match="exceeds the ladder's maximum of 204 s"):
        LADDER.units(LADDER.max_delay_ms + 25)


def test_the_default_ladder_reaches_past_30_days() -> None:
    """Cloud Tasks' longest delay; SQS stops at 15 minutes."""
    assert Topology().ladder.max_delay_ms / 1000 / 86400 > 30
    assert Topology().ladder.levels == 26


@pytest.mark.parametrize("delay_ms", [0, 10, 24.9])
def test_a_delay_under_half_a_step_is_no_delay(delay_ms: float) -> None:
    assert LADDER.route(delay_ms, "orders", 8) is None


def test_route_writes_the_delay_in_binary_and_enters_at_its_top_bit() -> None:
    route = LADDER.route(2000, "orders", 8)  # 40 units = 0b101000
    assert route is not None
    assert route.exchange == "zz.bandgate.delay.05"
    assert route.routing_key == "0.0.0.0.0.0.1.0.1.0.0.0.orders.8"
    assert route.delay_ms == 2000


def test_route_reports_the_rounded_delay() -> None:
    route = LADDER.route(1010, "orders", 3)
    assert route is not None
    assert route.delay_ms == 1000
    assert route.routing_key.endswith(".orders.3")


def test_bit_patterns_pick_one_word_per_level() -> None:
    assert LADDER.bit_pattern(11, "1") == "1.#"
    assert LADDER.bit_pattern(0, "0") == "*." * 11 + "0.#"
    assert LADDER.bit_pattern(5, "1") == "*." * 6 + "1.#"


def test_next_hop_goes_down_one_level_then_out() -> None:
    assert LADDER.next_hop(3) == "zz.bandgate.delay.02"
    assert LADDER.next_hop(0) == "zz.bandgate.delay.out"


# A walk through the plan with AMQP's own routing rules.


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: `*` is exactly one word, `#` zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


@dataclass
class Walk:
    queues: list[str]
    held_ms: int


def route(objects: Plan, exchange: str, key: str) -> list[str]:
    """The queues a message published to `exchange` with `key` reaches."""
    kinds = {e.name: e.type for e in objects.exchanges}
    reached: list[str] = []
    for binding in objects.bindings:
        if binding.source != exchange:
            continue
        if kinds[exchange] == "direct":
            matched = binding.routing_key == key
        else:
            matched = topic_matches(binding.routing_key, key)
        if not matched:
            continue
        if binding.destination_type == "queue":
            reached.append(binding.destination)
        else:
            reached.extend(route(objects, binding.destination, key))
    return reached


def walk(topology: Topology, delay_ms: float, queue: str, priority: int) -> Walk:
    """Follow a delayed message through delay queues (each expiring into its dead-letter
    exchange) until it reaches a queue outside the ladder."""
    objects = plan(topology)
    arguments = {q.name: q.arguments for q in objects.queues}
    prefix = naming.delay_level(topology.exchange, 0)[:-2]
    delay = topology.ladder.route(delay_ms, queue, priority)
    assert delay is not None
    exchange, key = delay.exchange, delay.routing_key
    visited: list[str] = []
    held = 0
    while True:
        reached = route(objects, exchange, key)
        assert len(reached) == 1, f"{key} on {exchange} reached {reached}"
        visited.append(reached[0])
        if not reached[0].startswith(prefix):
            return Walk(visited, held)
        args = arguments[reached[0]]
        held += args["x-message-ttl"]
        exchange = args["x-dead-letter-exchange"]
        assert "x-dead-letter-routing-key" not in args, "the ladder must keep the routing key"


@pytest.fixture(scope="module")
def small() -> Topology:
    return parse_topology(
        {
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {},
                "emails": {
                    "bands": [
                        {"name": "hot", "priorities": [5, 9]},
                        {"name": "cold", "priorities": [0, 4], "type": "classic"},
                    ]
                },
            },
        }
    )


@pytest.mark.parametrize(
    "units", [1, 2, 3, 6, 20, 40, 50, 2**11, 2**12 - 1, *random.Random(7).sample(range(1, 4096), 8)]
)
def test_a_delay_takes_popcount_hops_and_lands_in_its_band(small: Topology, units: int) -> None:
    walked = walk(small, units * 50, "orders", 8)
    assert walked.queues[-1] == "orders.hot"
    assert walked.held_ms == units * 50
    assert len(walked.queues) - 1 == bin(units).count("1")
    levels = [int(name.rsplit(".", 1)[1]) for name in walked.queues[:-1]]
    assert levels == sorted(levels, reverse=True), "hops go down the ladder, top bit first"


@pytest.mark.parametrize(
    ("queue", "priority", "band_queue"),
    [
        ("orders", 9, "orders.hot"),
        ("orders", 4, "orders.warm"),
        ("orders", 0, "orders.cold"),
        ("emails", 5, "emails.hot"),
        ("emails", 4, "emails.cold"),
    ],
)
def test_a_delayed_message_lands_in_the_band_of_its_priority(
    small: Topology, queue: str, priority: int, band_queue: str
) -> None:
    assert walk(small, 1234, queue, priority).queues[-1] == band_queue

"""Fair bands as pure logic: who the detector finds noisy (`core.fairness`), where the publisher
routes a noisy tenant's message, the noisy lane in the topology, and the order a fair band's
buffer starts its two queues in (`consumers.scheduling`)."""

from __future__ import annotations

import random
from typing import NamedTuple

import pytest

from bandgate.consumers.scheduling import (
    LANE_EVERY,
    BandBuffer,
    Dispatcher,
    ShardMerge,
    StrictPolicy,
)
from bandgate.core.fairness import MIN_COUNT, WINDOW, Fairness, TenantWindow
from bandgate.core.publishing import Publisher
from bandgate.topology import naming
from bandgate.topology.loader import TopologyError, parse_topology
from bandgate.topology.objects import BindingDecl, plan
from bandgate.topology.publish_input import MessageInputError, envelope_for
from bandgate.topology.wire import TENANT, Envelope, encode_properties

FAIR = parse_topology(
    {
        "queues": {
            "orders": {
                "bands": [
                    {"name": "hot", "priorities": [7, 9]},
                    {"name": "cold", "priorities": [0, 6], "fair": True},
                ]
            }
        }
    }
)


def shares(window: TenantWindow, tenants: list[str], publishes: int, seed: int = 1) -> set[str]:
    """Publish `publishes` messages of tenants drawn from `tenants` (repeats weigh more); the
    tenants sent to the lane in the second half (the window full by then)."""
    chooser = random.Random(seed)
    noisy: set[str] = set()
    for index in range(publishes):
        tenant = chooser.choice(tenants)
        if window.publish(tenant) and index >= publishes // 2:
            noisy.add(tenant)
    return noisy


def test_ten_equal_tenants_are_all_quiet() -> None:
    """SQS's 10 % alone would flip about half of them at random; the fair share keeps them."""
    tenants = [f"t{i}" for i in range(10)]
    assert shares(TenantWindow(), tenants, 20 * WINDOW) == set()


def test_a_tenant_with_twenty_times_its_share_is_noisy_and_only_it() -> None:
    tenants = ["flood"] * 20 + [f"t{i}" for i in range(9)]
    window = TenantWindow()
    assert shares(window, tenants, 10 * WINDOW) == {"flood"}
    assert window.noisy == {"flood"}


def test_one_of_two_tenants_sending_most_is_noisy() -> None:
    assert shares(TenantWindow(), ["a"] * 4 + ["b"], 10 * WINDOW) == {"a"}
    assert shares(TenantWindow(), ["a", "b"], 10 * WINDOW) == set()


def test_a_lone_tenant_is_never_noisy() -> None:
    """Nobody to protect: its messages stay in the band's queue."""
    window = TenantWindow()
    assert not any(window.publish("only") for _ in range(3 * WINDOW))


def test_fewer_than_the_minimum_count_is_never_noisy() -> None:
    window = TenantWindow()
    for tenant in ("a", "b", "c", "d", "e"):
        assert not window.publish(tenant)
    for _ in range(MIN_COUNT - 1):
        assert not window.publish("burst")
    assert window.publish("burst")  # 30 of 35, over 1.5 times the fair share of 6


def test_a_tenant_that_calms_down_is_quiet_again() -> None:
    window = TenantWindow(size=200)
    assert shares(window, ["flood"] * 20 + ["a", "b", "c"], 1000) == {"flood"}
    assert shares(window, ["flood", "a", "b", "c"], 1000, seed=2) == set()
    assert window.noisy == set()


def test_only_fair_bands_with_a_tenant_are_counted() -> None:
    fairness = Fairness([("orders", "cold")], size=100)
    assert not fairness.noisy("orders", "cold", "quiet")
    assert not any(fairness.noisy("orders", "hot", "flood") for _ in range(200))
    assert not any(fairness.noisy("orders", "cold", None) for _ in range(200))
    assert [fairness.noisy("orders", "cold", "flood") for _ in range(MIN_COUNT)][-1]


def test_the_publisher_routes_a_noisy_tenants_message_to_the_lane() -> None:
    publisher = Publisher(FAIR, channels=None)  # type: ignore[arg-type]  # routing only

    def key(tenant: str, priority: int = 2, delay: float | None = None) -> str:
        envelope = envelope_for(
            FAIR, FAIR.queue("orders"), {}, priority=priority, tenant=tenant, delay_seconds=delay
        )
        return publisher._route(envelope)[1]

    assert key("quiet") == "orders.2"
    assert key("flood") == "orders.2"
    for _ in range(MIN_COUNT):
        key("flood")
    assert key("flood") == naming.noisy_routing_key("orders", 2) == "noisy.orders.2"
    assert key("quiet") == "orders.2"
    assert key("flood", priority=8) == "orders.8"  # the hot band is not fair
    assert key("flood", delay=1.0).endswith(".orders.2")  # the delay ladder ends in the band
    assert not key("flood", delay=1.0).startswith("noisy.")


def test_the_tenant_travels_in_its_header_and_follows_the_input_rules() -> None:
    envelope = envelope_for(FAIR, FAIR.queue("orders"), {}, tenant="acme")
    headers = encode_properties(envelope).headers
    assert headers is not None
    assert headers[TENANT] == "acme"
    for bad in ("", "x" * 129, "a\nb", 7):
        with pytest.raises(MessageInputError) as refused:
            envelope_for(FAIR, FAIR.queue("orders"), {}, tenant=bad)
        assert refused.value.field == "tenant"
    assert Envelope("orders", {}, 2).tenant is None


def test_a_fair_band_is_its_queue_and_its_noisy_lane_bound_by_the_noisy_key() -> None:
    spec = FAIR.queue("orders")
    cold = spec.band("cold")
    assert spec.band_queues(cold) == ("orders.cold", "orders.cold.noisy")
    assert spec.band_queues(spec.band("hot")) == ("orders.hot",)
    objects = plan(FAIR)
    lane = next(queue for queue in objects.queues if queue.name == "orders.cold.noisy")
    main = next(queue for queue in objects.queues if queue.name == "orders.cold")
    assert lane.arguments == main.arguments
    into_lane = {b for b in objects.bindings if b.destination == "orders.cold.noisy"}
    assert into_lane == {
        BindingDecl("bandgate", "orders.cold.noisy", f"noisy.orders.{p}") for p in range(7)
    }


@pytest.mark.parametrize(
    ("queue", "words"),
    [
        (
            {"ordered": True, "bands": [{"name": "all", "priorities": [0, 9], "fair": True}]},
            "ordered",
        ),
        ({"bands": [{"name": "all", "priorities": [0, 9], "fair": True, "shards": 2}]}, "shards"),
    ],
)
def test_a_fair_band_is_refused_on_an_ordered_queue_and_with_shards(
    queue: dict[str, object], words: str
) -> None:
    with pytest.raises(TopologyError, match=f"fair.*{words}|{words}.*fair"):
        parse_topology({"queues": {"orders": queue}})


class Item(NamedTuple):
    name: str
    lane: int  # 0: the band's queue, 1: the noisy lane
    key: str | None = None


def lane_buffer() -> BandBuffer[Item]:
    return BandBuffer(2, lambda item: item.key, lambda item: item.lane, lane_every=LANE_EVERY)


def drain(band: BandBuffer[Item]) -> list[str]:
    names = []
    while (head := band.head(set())) is not None:
        names.append(band.pop(head).name)
    return names


def test_the_bands_queue_goes_first_and_the_lane_gets_one_in_lane_every() -> None:
    band = lane_buffer()
    for index in range(30):
        band.append(Item(f"lane{index}", 1))
    for index in range(30):
        band.append(Item(f"main{index}", 0))
    order = drain(band)
    assert order[: LANE_EVERY - 1] == [f"main{i}" for i in range(LANE_EVERY - 1)]
    assert order[LANE_EVERY - 1] == "lane0"
    # While both have work, exactly 1 in LANE_EVERY is the lane's; then the lane's rest.
    both = order[: order.index("main29") + 1]
    assert sum(name.startswith("lane") for name in both) == len(both) // LANE_EVERY
    assert order[len(both) :] == [f"lane{i}" for i in range(len(both) // LANE_EVERY, 30)]


def test_an_empty_bands_queue_lets_the_lane_run_work_conserving() -> None:
    band = lane_buffer()
    band.append(Item("lane0", 1))
    band.append(Item("lane1", 1))
    assert drain(band) == ["lane0", "lane1"]


def test_the_lane_ranks_with_its_band_in_the_waterfall() -> None:
    """A hot message starts before anything of the cold band, lane or not."""
    merge = ShardMerge((1, 2), lambda item: item.lane, lambda _: (0, 0.0), lanes=(False, True))
    lanes: Dispatcher[Item] = Dispatcher(
        2, StrictPolicy(), 4, key=lambda item: item.key, merge=merge
    )
    lanes.put(1, Item("cold-lane", 1))
    lanes.put(1, Item("cold-main", 0))
    lanes.put(0, Item("hot", 0))
    started = [lanes.take_nowait() for _ in range(3)]
    assert [(band, item.name) for band, item in filter(None, started)] == [
        (0, "hot"),
        (1, "cold-main"),
        (1, "cold-lane"),
    ]
    assert lanes.take_nowait() is None

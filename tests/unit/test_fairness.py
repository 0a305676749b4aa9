"""Fair bands as pure logic: who the detector finds noisy (`core.fairness`), where the publisher
routes a noisy tenant's message, the noisy lane in the topology, and the order a fair band's
buffer starts its two queues in (`consumers.scheduling`)."""

from __future__ import annotations

import heapq
import math
import random
import statistics
from typing import NamedTuple

import pytest

from bandgate.consumers import scheduling
from bandgate.consumers.scheduling import (
    LANE_EVERY,
    BandBuffer,
    Dispatcher,
    Headroom,
    QuietPool,
    ShardMerge,
    StrictPolicy,
)
from bandgate.core.fairness import (
    MIN_COUNT,
    ONSET_COUNT,
    ONSET_WINDOW,
    WINDOW,
    Fairness,
    TenantWindow,
)
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


def test_fewer_than_the_onset_count_is_never_noisy() -> None:
    window = TenantWindow()
    for tenant in ("a", "b", "c", "d", "e"):
        assert not window.publish(tenant)
    for _ in range(ONSET_COUNT - 1):
        assert not window.publish("burst")
    assert window.publish("burst")  # 16 of 21, over 3 times the fair share of 6


def test_without_the_onset_window_the_steady_rule_waits_for_its_minimum_count() -> None:
    window = TenantWindow(onset=1)  # a window of one never reaches the onset count
    for tenant in ("a", "b", "c", "d", "e"):
        assert not window.publish(tenant)
    for _ in range(MIN_COUNT - 1):
        assert not window.publish("burst")
    assert window.publish("burst")  # 30 of 35, over 1.5 times the fair share of 6


def flood_until_found(window: TenantWindow, seed: int) -> int:
    """Ten tenants publish evenly until the window is full, then `t0` floods at twenty times
    its share: how many of its messages were published before it was found noisy."""
    chooser = random.Random(seed)
    for _ in range(2 * WINDOW):
        window.publish(chooser.choice([f"t{i}" for i in range(10)]))
    mix = ["t0"] * 20 + [f"t{i}" for i in range(1, 10)]
    flood = 0
    while True:
        tenant = chooser.choice(mix)
        flood += tenant == "t0"
        if window.publish(tenant):
            assert tenant == "t0"
            return flood


def test_a_flood_after_a_calm_spell_is_found_within_the_onset_count() -> None:
    """The steady rule alone must first push the flood's share of the long window past the
    line (43-84 of its messages in these seeds); the onset window finds it within about
    `ONSET_COUNT`."""
    found = [flood_until_found(TenantWindow(), seed) for seed in range(20)]
    steady = [flood_until_found(TenantWindow(onset=1), seed) for seed in range(20)]
    assert max(found) <= ONSET_COUNT + 1, found
    assert min(steady) > 2 * ONSET_COUNT, steady


def chance_flags(tenants: int, onset: int) -> int:
    """Publishes sent to the lane among 40,000 of `tenants` equal tenants."""
    names = [f"t{i}" for i in range(tenants)]
    chooser = random.Random(tenants)
    window = TenantWindow(onset=onset)
    return sum(window.publish(chooser.choice(names)) for _ in range(40 * WINDOW))


@pytest.mark.parametrize("tenants", [2, 3, 5, 10, 15, 20])
def test_the_steady_rule_flags_no_equal_tenant_while_its_window_fills_or_after(
    tenants: int,
) -> None:
    """Its line is at least five standard deviations of a fair tenant's count above its
    mean: without that term a fresh window's few hundred publishes (10 % of 300 is 2.9
    deviations at ten tenants) and 15 tenants (10 % is 4.2) flagged tenants by chance."""
    assert chance_flags(tenants, onset=1) == 0


@pytest.mark.parametrize("tenants", [3, 4, 6, 8, 10, 11, 15, 30])
def test_the_onset_window_almost_never_flags_equal_tenants(tenants: int) -> None:
    """Its line is three times the fair share: the binomial tail puts a chance flag at under
    1.7e-5 of its windows, 5.8e-5 of publishes at worst over six seeds (flags come in short
    runs); this bound is 2e-4, for one seed."""
    added = chance_flags(tenants, ONSET_WINDOW) - chance_flags(tenants, onset=1)
    assert 0 <= added <= 40 * WINDOW * 2e-4, added


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
    assert key("flood") == naming.noisy_routing_key("orders", 2) == "orders.2.noisy"
    assert key("quiet") == "orders.2"
    assert key("flood", priority=8) == "orders.8"  # the hot band is not fair
    # The delay ladder ends in the lane too, and in the band for a quiet tenant.
    assert key("flood", delay=1.0).endswith(".orders.2.noisy")
    assert key("quiet", delay=1.0).endswith(".orders.2")


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


def test_a_fair_band_is_its_queue_and_its_noisy_lane_bound_by_the_noisy_keys() -> None:
    spec = FAIR.queue("orders")
    cold = spec.band("cold")
    assert spec.band_queues(cold) == ("orders.cold", "orders.cold.noisy")
    assert spec.band_queues(spec.band("hot")) == ("orders.hot",)
    objects = plan(FAIR)
    lane = next(queue for queue in objects.queues if queue.name == "orders.cold.noisy")
    main = next(queue for queue in objects.queues if queue.name == "orders.cold")
    assert lane.arguments == main.arguments
    into_lane = {b for b in objects.bindings if b.destination == "orders.cold.noisy"}
    exit_exchange = naming.delay_exit_exchange("bandgate")
    assert into_lane == {
        BindingDecl("bandgate", "orders.cold.noisy", f"orders.{p}.noisy") for p in range(7)
    } | {BindingDecl(exit_exchange, "orders.cold.noisy", f"#.orders.{p}.noisy") for p in range(7)}


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
    merge: ShardMerge[Item] = ShardMerge(
        (1, 2), lambda item: item.lane, lambda _: (0, 0.0), lanes=(False, True)
    )
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


class Job(NamedTuple):
    kind: str  # hot, quiet or flood
    lane: int
    at: float


def simulate(flood: bool, quiet_rate: float, seconds: float = 20.0) -> dict[str, list[float]]:
    """A worker of 16 slots on three bands, the coldest fair, in simulated time: hot messages
    at 50/s, quiet tenants' at `quiet_rate`/s into the band's queue, with `flood` a backlog
    of 20,000 in the lane; handlers of 50 ms on average (exponential). Each kind's waits."""
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    headroom = Headroom(16, idle_after=0.5, quiet_after=0.1, clock=clock)
    merge: ShardMerge[Job] = ShardMerge(
        (1, 1, 2), lambda job: job.lane, lambda _: (0, 0.0), lanes=(False, False, True)
    )
    dispatcher = Dispatcher(3, StrictPolicy(), 16, merge=merge, headroom=headroom, clock=clock)
    chance = random.Random(1)
    events: list[tuple[float, int, str, int, Job | None]] = []
    for kind, rate in (("quiet", quiet_rate), ("hot", 50.0)):
        at = 0.0
        while (at := at + chance.expovariate(rate)) < seconds:
            heapq.heappush(events, (at, len(events), kind, 0, None))
    if flood:
        for _ in range(20_000):
            dispatcher.put(2, Job("flood", 1, 0.0))
    waits: dict[str, list[float]] = {"hot": [], "quiet": [], "flood": []}

    def start() -> None:
        while (taken := dispatcher.take_nowait()) is not None:
            band, job = taken
            waits[job.kind].append(now[0] - job.at)
            end = now[0] + chance.expovariate(1 / 0.05)
            heapq.heappush(events, (end, len(events), "end", band, job))

    while events and events[0][0] < seconds:
        now[0], _, kind, band, job = heapq.heappop(events)
        if kind == "end":
            assert job is not None
            dispatcher.done(band, job)
        elif kind == "hot":
            headroom.hotter_arrived()
            dispatcher.put(0, Job("hot", 0, now[0]))
        else:
            dispatcher.put(2, Job("quiet", 0, now[0]))
        start()
    return waits


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


@pytest.mark.parametrize("quiet_rate", [100.0, 173.0])
def test_under_a_flood_quiet_tenants_wait_at_most_twice_as_long_and_the_band_drains(
    quiet_rate: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flood in the lane takes the slots the quiet tenants leave, not their p99: within
    twice their p99 without a flood (at 30 % and 54 % of the slots). Against a lane that keeps
    no slot for them, the quiet pool (their mean load and half a standard deviation) costs
    under 20 % of the band's starts while the flood lasts (19 % and 9 %) and lowers their mean
    and p99 wait."""
    calm = simulate(flood=False, quiet_rate=quiet_rate)
    flooded = simulate(flood=True, quiet_rate=quiet_rate)
    assert p99(flooded["quiet"]) <= 2 * p99(calm["quiet"])
    assert p99(flooded["hot"]) <= max(0.005, 2 * p99(calm["hot"]))
    monkeypatch.setattr(scheduling, "LANE_KEEPS_FROM", 10**6)  # the lane keeps nothing
    greedy = simulate(flood=True, quiet_rate=quiet_rate)
    starts = len(flooded["quiet"]) + len(flooded["flood"])
    assert starts >= 0.80 * (len(greedy["quiet"]) + len(greedy["flood"]))
    assert statistics.mean(flooded["quiet"]) < statistics.mean(greedy["quiet"])
    assert p99(flooded["quiet"]) < p99(greedy["quiet"])


def test_the_lane_gets_its_share_while_quiet_tenants_saturate_the_band() -> None:
    waits = simulate(flood=True, quiet_rate=1000.0, seconds=5.0)
    share = len(waits["flood"]) / (len(waits["flood"]) + len(waits["quiet"]))
    assert share >= 1 / LANE_EVERY - 0.005


class Tick:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_quiet_pool_follows_the_load_of_the_bands_own_queue() -> None:
    """`ceil(a + LANE_SPREAD sqrt(a))` slots, `a` the slots the band's own messages held on
    average; the lane leaves free those of them not held now, and `LANE_KEEPS` at the least."""
    clock = Tick()
    pool = QuietPool(clock)
    assert pool.size() == 0
    assert pool.kept() == scheduling.LANE_KEEPS
    for _ in range(9):
        pool.started()
    clock.now += 20 * scheduling.AVERAGE_SECONDS  # nine slots held for a long while
    assert pool.load() == pytest.approx(9.0)
    assert pool.size() == math.ceil(9 + scheduling.LANE_SPREAD * 3)
    assert pool.kept() == max(scheduling.LANE_KEEPS, pool.size() - 9)
    for _ in range(5):
        pool.ended()
    assert pool.kept() == pool.size() - 4  # just ended: the load is still remembered
    clock.now += 20 * scheduling.AVERAGE_SECONDS
    assert pool.load() == pytest.approx(4.0)
    for _ in range(4):
        pool.ended()
    clock.now += 20 * scheduling.AVERAGE_SECONDS
    assert pool.load() == pytest.approx(0.0, abs=1e-6)
    assert pool.kept() == scheduling.LANE_KEEPS


def fair_dispatcher(
    concurrency: int, clock: Tick, headroom: Headroom | None = None
) -> Dispatcher[Item]:
    merge: ShardMerge[Item] = ShardMerge(
        (1, 2), lambda item: item.lane, lambda _: (0, 0.0), lanes=(False, True)
    )
    return Dispatcher(
        2,
        StrictPolicy(),
        concurrency,
        key=lambda item: item.key,
        merge=merge,
        clock=clock,
        headroom=headroom,
    )


def start_quiet(dispatcher: Dispatcher[Item], count: int) -> list[Item]:
    """`count` quiet tenants' messages arrive in the band's own queue, each started at once."""
    quiet = []
    for index in range(count):
        dispatcher.put(1, Item(f"quiet{index}", 0))
        taken = dispatcher.take_nowait()
        assert taken is not None
        quiet.append(taken[1])
    return quiet


def quiet_load(
    dispatcher: Dispatcher[Item], clock: Tick, running: int, spread: float = scheduling.LANE_SPREAD
) -> int:
    """Quiet tenants held 8 slots for a while; `running` of them still run, and one more
    arrived and started: the pool is 8 slots and its margin (`spread` standard deviations),
    the slots it leaves free."""
    quiet = start_quiet(dispatcher, 8)
    clock.now += 10 * scheduling.AVERAGE_SECONDS
    for item in quiet[running:]:
        dispatcher.done(1, item)
    dispatcher.put(1, Item("arrival", 0))  # an arrival lately: the pool applies
    assert dispatcher.take_nowait() is not None
    clock.now += 0.01
    pool = math.ceil(8 + spread * math.sqrt(8))
    return max(scheduling.LANE_KEEPS, pool - running - 1)


def test_the_lane_leaves_the_quiet_tenants_the_slots_their_load_asks_for() -> None:
    """The quiet tenants' load was 8 slots and 5 run: the lane leaves 3 free (not 1, as a
    lane that kept the last slot did), and quiet arrivals start at once."""
    clock = Tick()
    dispatcher = fair_dispatcher(16, clock)
    kept = quiet_load(dispatcher, clock, running=4)
    assert kept >= 3
    started = 0
    for index in range(50):
        dispatcher.put(1, Item(f"flood{index}", 1))
    while (taken := dispatcher.take_nowait()) is not None:
        assert taken[1].lane == 1
        started += 1
    # The lane stops with the pool's free slots left; its turn may take one of them.
    assert 16 - 5 - kept <= started <= 16 - 5 - kept + 1
    for index in range(kept - 1):
        dispatcher.put(1, Item(f"late{index}", 0))
        taken = dispatcher.take_nowait()
        assert taken is not None
        assert taken[1].name == f"late{index}"


def test_without_quiet_arrivals_the_lane_takes_every_slot() -> None:
    clock = Tick()
    dispatcher = fair_dispatcher(16, clock)
    quiet_load(dispatcher, clock, running=4)
    clock.now += scheduling.IDLE_AFTER  # the band's own queue idle since: nothing kept
    for index in range(50):
        dispatcher.put(1, Item(f"flood{index}", 1))
    started = 0
    while dispatcher.take_nowait() is not None:
        started += 1
    assert started == 16 - 5


def test_the_pool_holds_where_the_slots_are_receives_waiting() -> None:
    """HTTP receivers: the slots are the leases and the receives waiting (`takers_waiting`),
    not the concurrency (the lease limit). The lane leaves receives waiting for the band's own
    queue, as a worker leaves slots free, with the takers' wider margin: 9 of the 11 waiting
    where a worker's pool would keep 5."""
    clock = Tick()
    room = Headroom(256, idle_after=0.5, clock=clock)
    dispatcher = fair_dispatcher(256, clock, headroom=room)
    dispatcher.takers_waiting(16 - 8)
    kept = quiet_load(dispatcher, clock, running=4, spread=scheduling.TAKERS_LANE_SPREAD)
    assert kept == 9  # ceil(8 + 2.0 sqrt(8)) - 5; a worker's pool: ceil(8 + 0.5 sqrt(8)) - 5 = 5
    dispatcher.takers_waiting(16 - 5)  # 16 receive loops: 5 hold a lease, 11 wait
    for index in range(50):
        dispatcher.put(1, Item(f"flood{index}", 1))
    started = 0
    while dispatcher.take_nowait() is not None:
        started += 1
        dispatcher.takers_waiting(16 - 5 - started)
    assert room.slots(dispatcher.running) == 16
    assert 16 - 5 - kept <= started <= 16 - 5 - kept + 1


def test_after_an_idle_spell_the_pool_measures_the_load_afresh() -> None:
    """Quiet tenants and a flood that start together after a quiet spell: the pool follows the
    quiet tenants' load from their first message, not averaged with the idle time before it."""
    clock = Tick()
    dispatcher = fair_dispatcher(16, clock)
    clock.now += 5.0  # idle since the worker started
    quiet = start_quiet(dispatcher, 8)
    clock.now += 0.05
    for item in quiet[4:]:
        dispatcher.done(1, item)
    for index in range(50):
        dispatcher.put(1, Item(f"flood{index}", 1))
    started = 0
    while dispatcher.take_nowait() is not None:
        started += 1
    # The pool follows the 8 slots held since the first arrival (and its margin): the 4 still
    # held, the rest kept free.
    free = math.ceil(8 + scheduling.LANE_SPREAD * math.sqrt(8)) - 4
    assert 16 - 4 - free <= started <= 16 - 4 - free + 1

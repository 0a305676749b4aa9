"""The merge over the heads of a sharded band's buffers (`bandgate.consumers.scheduling`), as
pure logic, and through the dispatcher: best head first, per-key order kept, one queue as
before."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

import pytest
from aiormq.abc import DeliveredMessage
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from bandgate.consumers.scheduling import (
    BandBuffer,
    Dispatcher,
    Rank,
    ShardMerge,
    StrictPolicy,
    WeightedPolicy,
    shard_merge,
)
from bandgate.consumers.subscription import Delivery, Subscription
from bandgate.core.protocol.deliveries import Incoming
from bandgate.topology import wire
from bandgate.topology.loader import parse_topology


class Item(NamedTuple):
    name: str
    shard: int
    priority: int
    enqueued: float = 0.0
    key: str | None = None


def rank(item: Item) -> Rank:
    return (-item.priority, item.enqueued)


def buffer(shards: int) -> BandBuffer[Item]:
    return BandBuffer(shards, lambda item: item.key, lambda item: item.shard, rank)


def drain(band: BandBuffer[Item]) -> list[str]:
    """The names in the order the buffer gives them out, nothing running."""
    names = []
    while (head := band.head(set())) is not None:
        names.append(band.pop(head).name)
    return names


def merge(shards: int) -> ShardMerge[Item]:
    return ShardMerge((1, shards), lambda item: item.shard, rank)


def test_the_best_head_starts_first_priority_then_age_then_shard() -> None:
    band = buffer(4)
    for item in (
        Item("s0-p3", 0, 3),
        Item("s1-p7-late", 1, 7, enqueued=2.0),
        Item("s2-p7-early", 2, 7, enqueued=1.0),
        Item("s3-p7-late", 3, 7, enqueued=2.0),
    ):
        band.append(item)
    assert len(band) == 4
    assert drain(band) == ["s2-p7-early", "s1-p7-late", "s3-p7-late", "s0-p3"]
    assert len(band) == 0


def test_only_the_heads_are_compared_each_shard_keeps_its_order() -> None:
    """A FIFO shard (RabbitMQ 3.10) with a hot message behind a cold one: the hot one waits for
    the cold one ahead of it in its shard, as the broker ordered them."""
    band = buffer(2)
    for item in (Item("s0-p1", 0, 1), Item("s0-p9", 0, 9), Item("s1-p5", 1, 5)):
        band.append(item)
    assert drain(band) == ["s1-p5", "s0-p1", "s0-p9"]


def test_a_band_of_one_queue_keeps_arrival_order() -> None:
    band = buffer(1)
    for item in (Item("a", 0, 1), Item("b", 0, 9), Item("c", 0, 5)):
        band.append(item)
    assert drain(band) == ["a", "b", "c"]


def test_a_busy_key_makes_its_shards_next_free_message_the_head() -> None:
    band = buffer(2)
    for item in (
        Item("s0-a1", 0, 9, key="a"),
        Item("s0-a2", 0, 9, key="a"),
        Item("s0-b1", 0, 2, key="b"),
        Item("s1-c1", 1, 4, key="c"),
    ):
        band.append(item)
    # a is running: its later message must not start, so shard 0 offers b1.
    head = band.head({"a"})
    assert head is not None
    assert band.pop(head).name == "s1-c1"
    head = band.head({"a"})
    assert head is not None
    assert band.pop(head).name == "s0-b1"
    assert band.head({"a"}) is None
    assert band.at_hand({"a"}) == []
    assert [item.name for item in band.at_hand(set())] == ["s0-a1", "s0-a2"]


def test_discard_and_clear_span_every_shard() -> None:
    band = buffer(3)
    for n in range(9):
        band.append(Item(f"s{n % 3}-{n}", n % 3, n))
    dropped = band.discard(lambda item: item.shard == 1)
    assert [item.name for item in dropped] == ["s1-1", "s1-4", "s1-7"]
    assert len(band) == 6
    assert [item.name for item in band] == ["s0-0", "s0-3", "s0-6", "s2-2", "s2-5", "s2-8"]
    band.clear()
    assert len(band) == 0
    assert band.head(set()) is None


def test_the_dispatcher_merges_within_a_band_and_keeps_the_waterfall_across_bands() -> None:
    work = Dispatcher(2, StrictPolicy(), 1, key=lambda item: item.key, merge=merge(2))
    work.put(1, Item("warm-s0-p4", 0, 4))
    work.put(1, Item("warm-s1-p6", 1, 6))
    work.put(0, Item("hot-p7", 0, 7))
    assert work.take_nowait() == (0, Item("hot-p7", 0, 7))  # the hotter band first
    work.done(0, Item("hot-p7", 0, 7))
    taken = work.take_nowait()
    assert taken is not None
    assert taken[1].name == "warm-s1-p6"
    work.done(*taken)
    assert work.close() == [(1, Item("warm-s0-p4", 0, 4))]


def test_without_the_merge_a_sharded_band_starts_in_arrival_order() -> None:
    work: Dispatcher[Item] = Dispatcher(2, StrictPolicy(), 3)
    for item in (Item("s0-p1", 0, 1), Item("s1-p9", 1, 9), Item("s0-p5", 0, 5)):
        work.put(1, item)
    assert [taken[1].name for taken in iter(work.take_nowait, None)] == ["s0-p1", "s1-p9", "s0-p5"]


def test_the_weighted_policy_still_shares_starts_between_bands() -> None:
    work = Dispatcher(2, WeightedPolicy([2, 1]), 1, merge=merge(4))
    for n in range(30):
        work.put(0, Item(f"hot-{n}", 0, 9))
        work.put(1, Item(f"warm-{n}", n % 4, n % 10))
    bands = []
    for _ in range(30):
        taken = work.take_nowait()
        assert taken is not None
        bands.append(taken[0])
        work.done(*taken)
    assert bands.count(0) == 20
    assert bands.count(1) == 10


def test_merge_must_cover_every_band() -> None:
    with pytest.raises(ValueError, match="every band"):
        Dispatcher(3, StrictPolicy(), 1, merge=merge(2))


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    shards=st.integers(1, 5),
    count=st.integers(1, 60),
    concurrency=st.integers(1, 4),
)
def test_every_start_is_the_best_free_head_and_each_key_starts_in_its_shard_order(
    seed: int, shards: int, count: int, concurrency: int
) -> None:
    """Messages arrive into random shards (a key always into the same one) while slots start
    and finish them at random: every start is the best of the shards' first messages whose key
    is free, and each key's messages start one at a time in the order they arrived."""
    rng = random.Random(seed)
    work = Dispatcher(
        2, StrictPolicy(), concurrency, key=lambda item: item.key, merge=merge(shards)
    )
    keys = [f"k{n}" for n in range(6)]
    arrived: dict[str | None, list[str]] = {}
    started: dict[str | None, list[str]] = {}
    running: list[Item] = []
    pending = [
        Item(f"m{n}", 0, rng.randint(0, 9), rng.random(), rng.choice([*keys, None]))
        for n in range(count)
    ]
    while pending or running or work.buffered():
        roll = rng.random()
        if pending and roll < 0.5:
            raw = pending.pop(0)
            shard = keys.index(raw.key) % shards if raw.key else rng.randrange(shards)
            item = raw._replace(shard=shard)
            arrived.setdefault(item.key, []).append(item.name)
            work.put(1, item)
        elif running and roll < 0.75:
            work.done(1, running.pop(rng.randrange(len(running))))
        else:
            at_hand = work.at_hand(1)
            heads = [next(i for i in at_hand if i.shard == s) for s in {i.shard for i in at_hand}]
            taken = work.take_nowait()
            if taken is None:
                assert not heads or len(running) == concurrency
                continue
            _, item = taken
            assert item in heads
            assert rank(item) == min(rank(head) for head in heads)
            assert item.key is None or all(other.key != item.key for other in running)
            started.setdefault(item.key, []).append(item.name)
            running.append(item)
    assert {key: names for key, names in started.items() if key is not None} == {
        key: names for key, names in arrived.items() if key is not None
    }


def incoming(priority: int | None, headers: dict[str, Any], stamp: datetime) -> Incoming:
    properties = Basic.Properties(priority=priority, headers=headers, timestamp=stamp)
    return Incoming(
        DeliveredMessage(
            delivery=Basic.Deliver(consumer_tag="c", delivery_tag=1, routing_key="r"),
            header=ContentHeader(properties=properties),
            body=b"{}",
            channel=cast(Any, None),
        )
    )


def test_deliveries_rank_by_the_priority_the_handler_sees_then_enqueue_time() -> None:
    bands = [
        {"name": "hot", "priorities": [5, 9]},
        {"name": "cold", "priorities": [0, 4], "shards": 4},
    ]
    topology = parse_topology({"queues": {"orders": {"ordered": True, "bands": bands}}})
    spec = topology.queue("orders")
    subscription = Subscription(1, "orders.cold.3", 1, single_active=True, shard=3)
    early = datetime(2026, 1, 1, tzinfo=UTC)
    late = datetime(2026, 1, 2, tzinfo=UTC)

    def delivery(priority: int | None, headers: dict[str, Any], stamp: datetime) -> Delivery:
        return Delivery(subscription, incoming(priority, headers, stamp), None)

    ranked = shard_merge(spec)
    assert ranked.shards == (1, 4)
    in_header = delivery(None, {wire.PRIORITY: 3, wire.ENQUEUED_AT: wire.to_millis(late)}, early)
    assert ranked.source(in_header) == 3
    assert ranked.rank(in_header) == (-3, late.timestamp() * 1000)  # header over the AMQP timestamp
    assert ranked.rank(delivery(4, {}, early)) == (-4, early.timestamp() * 1000)
    assert ranked.rank(delivery(None, {}, early)) == (
        0,
        early.timestamp() * 1000,
    )  # the band's lowest

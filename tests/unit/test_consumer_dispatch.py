from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from bandgate.consumers.scheduling import (
    Dispatcher,
    DispatcherClosed,
    StrictPolicy,
    WeightedPolicy,
    default_prefetch,
    inversion_window,
    make_policy,
    shard_prefetch,
)

Item = tuple[str, str | None]  # (name, partition key)


def dispatcher(bands: int = 3, concurrency: int = 2, policy: str = "strict") -> Dispatcher[Item]:
    weights = [2.0 ** (bands - 1 - index) for index in range(bands)]
    chosen = make_policy("weighted" if policy == "weighted" else "strict", weights)
    return Dispatcher(bands, chosen, concurrency, key=lambda item: item[1])


def test_strict_takes_the_hottest_band_at_hand() -> None:
    policy = StrictPolicy()
    assert policy.pick([False, True, True]) == 1
    assert policy.pick([True, True, True]) == 0
    assert policy.pick([False, False, True]) == 2


def test_weighted_shares_match_the_weights_and_interleave() -> None:
    policy = WeightedPolicy([4, 2, 1])
    picks = [policy.pick([True, True, True]) for _ in range(700)]
    assert Counter(picks) == {0: 400, 1: 200, 2: 100}
    # Smooth: the coldest band is never kept waiting for more than one cycle of 7.
    cold = [index for index, band in enumerate(picks) if band == 2]
    assert max(b - a for a, b in zip(cold, cold[1:], strict=False)) == 7


def test_weighted_idle_bands_lend_their_share() -> None:
    policy = WeightedPolicy([4, 2, 1])
    picks = [policy.pick([False, True, True]) for _ in range(300)]
    assert Counter(picks) == {1: 200, 2: 100}
    # When the hot band comes back it gets its share at once, not a saved-up burst.
    picks = [policy.pick([True, True, True]) for _ in range(7)]
    assert Counter(picks) == {0: 4, 1: 2, 2: 1}


def test_weighted_rejects_bad_weights() -> None:
    with pytest.raises(ValueError, match="positive"):
        WeightedPolicy([1, 0])
    with pytest.raises(ValueError, match="no band"):
        WeightedPolicy([1]).pick([False])


def test_default_prefetch_strict_keeps_the_coldest_band_small() -> None:
    assert default_prefetch("strict", 8, 3) == (16, 16, 2)
    assert default_prefetch("strict", 32, 3) == (64, 64, 8)
    assert default_prefetch("strict", 8, 1) == (16,)
    assert default_prefetch("weighted", 8, 3) == (16, 16, 16)


def test_inversion_window_formula() -> None:
    assert inversion_window(8, (16, 16, 2)) == 8  # min(C, 16 + 2)
    assert inversion_window(8, (16, 16, 2), band=1) == 2
    assert inversion_window(8, (16, 2, 2)) == 4
    assert inversion_window(8, (16,)) == 0


def test_a_free_slot_takes_the_hottest_buffered_message() -> None:
    work = dispatcher(concurrency=2)
    work.put(2, ("cold-1", None))
    work.put(1, ("warm-1", None))
    work.put(0, ("hot-1", None))
    assert work.take_nowait() == (0, ("hot-1", None))
    assert work.take_nowait() == (1, ("warm-1", None))
    assert work.take_nowait() is None  # both slots busy
    assert work.running == 2
    work.done(0, ("hot-1", None))
    work.put(0, ("hot-2", None))
    assert work.take_nowait() == (0, ("hot-2", None))


def test_strict_never_starts_colder_work_while_hotter_is_at_hand() -> None:
    """Saturated: every band is topped up before each pick, slots free one at a time."""
    work = dispatcher(concurrency=4)
    started: list[int] = []
    running: list[tuple[int, Item]] = []

    def top_up(step: int) -> None:
        for band in range(3):
            while work.buffered(band) < 2:
                work.put(band, (f"{band}-{step}", None))

    for step in range(100):
        top_up(step)
        while (taken := work.take_nowait()) is not None:
            started.append(taken[0])
            running.append(taken)
            top_up(step)
        work.done(*running.pop(0))
    assert len(started) == 103
    assert set(started) == {0}


def test_same_partition_key_runs_one_at_a_time_in_order() -> None:
    work = dispatcher(concurrency=3)
    work.put(0, ("a1", "a"))
    work.put(0, ("a2", "a"))
    work.put(0, ("b1", "b"))
    work.put(1, ("warm", "a"))  # another band: its own order
    assert work.take_nowait() == (0, ("a1", "a"))
    assert work.take_nowait() == (0, ("b1", "b"))  # a2 waits for a1
    assert work.take_nowait() == (1, ("warm", "a"))
    work.done(0, ("a1", "a"))
    assert work.take_nowait() == (0, ("a2", "a"))


async def test_take_waits_for_a_slot_and_for_work() -> None:
    work = dispatcher(concurrency=1)
    waiting = asyncio.create_task(work.take())
    await asyncio.sleep(0)
    assert not waiting.done()
    work.put(2, ("cold", None))
    assert await asyncio.wait_for(waiting, 1) == (2, ("cold", None))
    work.put(0, ("hot", None))
    blocked = asyncio.create_task(work.take())
    await asyncio.sleep(0)
    assert not blocked.done()  # the only slot is busy
    work.done(2, ("cold", None))
    assert await asyncio.wait_for(blocked, 1) == (0, ("hot", None))


async def test_close_returns_the_buffered_messages_and_wakes_the_taker() -> None:
    work = dispatcher(concurrency=1)
    work.put(0, ("running", None))
    assert work.take_nowait() is not None
    work.put(0, ("hot", None))
    work.put(2, ("cold", None))
    waiting = asyncio.create_task(work.take())
    await asyncio.sleep(0)
    assert work.close() == [(0, ("hot", None)), (2, ("cold", None))]
    with pytest.raises(DispatcherClosed):
        await asyncio.wait_for(waiting, 1)
    assert work.buffered() == 0
    work.put(0, ("late", None))
    assert work.take_nowait() is None


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Dispatcher(1, StrictPolicy(), 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refilling(clock: Clock) -> Dispatcher[Item]:
    return Dispatcher(3, StrictPolicy(), 4, key=lambda item: item[1], refill_wait=0.1, clock=clock)


def asked(work: Dispatcher[Item]) -> list[int]:
    """The bands put in `questions` since the last call."""
    bands = []
    while not work.questions.empty():
        bands.append(work.questions.get_nowait())
    return bands


def test_a_backlogged_band_that_runs_dry_keeps_its_claim_for_the_refill_wait() -> None:
    clock = Clock()
    work = refilling(clock)
    work.put(0, ("hot-1", None))
    work.put(0, ("hot-2", None))  # found the buffer non-empty: a backlog
    work.put(2, ("cold-1", None))
    assert work.take_nowait() == (0, ("hot-1", None))
    assert work.take_nowait() == (0, ("hot-2", None))
    assert asked(work) == []  # nothing waits for it yet
    assert work.take_nowait() is None  # the hot refill is probably on its way
    assert asked(work) == [0]  # cold work waits: the owner is asked to check the broker
    assert work.take_nowait() is None
    assert asked(work) == []  # once per dry spell
    assert work.waiting_for_refill() == [0]
    clock.now += 0.05
    work.put(0, ("hot-3", None))  # and here it is
    assert work.take_nowait() == (0, ("hot-3", None))
    assert work.take_nowait() is None  # dry again, a fresh wait
    clock.now += 0.11
    assert work.take_nowait() == (2, ("cold-1", None))  # the wait ran out
    assert work.waiting_for_refill() == []


def test_a_band_running_dry_with_nothing_colder_at_hand_asks_nothing() -> None:
    work = refilling(Clock())
    for name in ("cold-1", "cold-2", "cold-3"):
        work.put(2, (name, None))
    assert [work.take_nowait() for _ in range(3)] == [
        (2, ("cold-1", None)),
        (2, ("cold-2", None)),
        (2, ("cold-3", None)),
    ]
    assert work.take_nowait() is None
    assert asked(work) == []  # the coldest band holds nothing back: no broker round trip


def test_a_band_without_backlog_makes_nobody_wait() -> None:
    work = refilling(Clock())
    work.put(0, ("hot-1", None))
    assert work.take_nowait() == (0, ("hot-1", None))
    work.put(2, ("cold-1", None))
    assert work.take_nowait() == (2, ("cold-1", None))


def test_refill_ended_ends_the_wait_when_the_broker_has_nothing_more() -> None:
    work = refilling(Clock())
    for name in ("hot-1", "hot-2", "cold-1"):
        work.put(2 if name.startswith("cold") else 0, (name, None))
    assert work.take_nowait() is not None
    assert work.take_nowait() is not None
    assert work.take_nowait() is None
    work.refill_ended(0)
    assert work.take_nowait() == (2, ("cold-1", None))


async def test_take_wakes_up_when_the_refill_wait_runs_out() -> None:
    work: Dispatcher[Item] = Dispatcher(3, StrictPolicy(), 4, refill_wait=0.05)
    work.put(0, ("hot-1", None))
    work.put(0, ("hot-2", None))
    work.put(1, ("warm-1", None))
    assert (await work.take())[0] == 0
    assert (await work.take())[0] == 0
    assert await asyncio.wait_for(work.take(), 1) == (1, ("warm-1", None))


async def test_a_take_waiting_after_a_refill_wait_ran_out_sleeps_until_a_message_arrives() -> None:
    """Every buffer empty and the refill wait over: `take` waits for the next put, it does
    not spin (it looked about 20,000 times in these 0.2 s before)."""
    work: Dispatcher[Item] = Dispatcher(3, StrictPolicy(), 4, refill_wait=0.01)
    work.put(0, ("hot-1", None))
    work.put(0, ("hot-2", None))  # a backlog, which then runs dry
    assert (await work.take())[0] == 0
    assert (await work.take())[0] == 0
    looks = 0
    look = work.take_nowait

    def counted(headroom: bool = True) -> tuple[int, Item] | None:
        nonlocal looks
        looks += 1
        return look(headroom)

    work.take_nowait = counted  # type: ignore[method-assign]
    waiting = asyncio.ensure_future(work.take())
    await asyncio.sleep(0.2)  # twenty refill waits
    assert not waiting.done()
    assert looks <= 3  # the first look, the one when the wait ran out, and no more
    work.put(2, ("cold-1", None))
    assert await asyncio.wait_for(waiting, 1) == (2, ("cold-1", None))


def test_weighted_peek_changes_nothing_until_commit() -> None:
    policy = WeightedPolicy([2, 1])
    assert policy.peek([True, True]) == 0
    assert policy.peek([True, True]) == 0
    policy.commit([True, True], 0)
    assert policy.peek([True, True]) == 1


def test_discard_takes_a_queues_messages_out_and_keeps_the_rest_in_order() -> None:
    work = dispatcher(concurrency=1)
    for name in ("s0-a", "s1-b", "s0-c", "s1-d"):
        work.put(0, (name, None))
    dropped = work.discard(0, lambda item: item[0].startswith("s0"))
    assert dropped == [("s0-a", None), ("s0-c", None)]
    assert work.buffered(0) == 2
    assert work.take_nowait() == (0, ("s1-b", None))


def test_a_bands_prefetch_is_split_over_its_shards_rounded_up() -> None:
    assert [shard_prefetch(16, shards) for shards in (1, 2, 3, 16, 40)] == [16, 8, 6, 1, 1]
    assert shard_prefetch(2, 3) == 1

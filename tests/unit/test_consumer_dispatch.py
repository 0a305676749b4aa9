from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from consumers.dispatch import (
    Dispatcher,
    DispatcherClosed,
    StrictPolicy,
    WeightedPolicy,
    default_prefetch,
    inversion_window,
    make_policy,
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


def test_discard_drops_stale_items_only() -> None:
    work = dispatcher()
    for name in ("a", "b", "c"):
        work.put(1, (name, None))
    assert work.discard(lambda item: item[0] == "b") == [("b", None)]
    assert work.buffered(1) == 2


def test_concurrency_must_be_positive() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Dispatcher(1, StrictPolicy(), 0)

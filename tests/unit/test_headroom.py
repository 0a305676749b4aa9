"""The coldest band's headroom (`consumers.headroom`): the reserve follows hotter work's use of
the slots, and the dispatcher keeps cold work off it."""

from __future__ import annotations

from bandgate.consumers.dispatch import Dispatcher, StrictPolicy
from bandgate.consumers.headroom import Headroom

C = 16


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_reserve_until_hotter_work_arrives_and_none_after_it_stops() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    assert room.reserve() == 0  # a cold-only load fills every slot
    room.hotter_arrived()
    assert room.reserve() == 1  # nothing busy yet: one slot kept for the next arrival
    clock.now += 0.6
    assert room.reserve() == 0


def test_a_drained_hotter_backlog_gives_the_slots_back_sooner() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, quiet_after=0.1, clock=clock)
    room.hotter_arrived()
    clock.now += 0.05
    room.hotter_drained()
    clock.now += 0.06
    assert room.reserve() == 0


def test_a_drained_backlog_leaves_a_reserve_for_what_still_runs_only() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, quiet_after=0.1, clock=clock)
    room.hotter_arrived()
    room.hotter_busy(C)  # a warm backlog on every slot
    clock.now += 2
    room.hotter_arrived()
    assert room.reserve() == C - C // 4
    clock.now += 0.01
    room.hotter_busy(1)  # its last messages finish
    room.hotter_drained()
    assert room.reserve() == 5  # ceil(1 + 3 * 1) + 1, no longer the backlog's average
    clock.now += 0.11
    assert room.reserve() == 0


def test_the_reserve_follows_the_average_busy_slots_with_a_margin() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    # Light hot traffic: one slot busy a quarter of the time (50/s of 5 ms handlers).
    for _ in range(200):
        room.hotter_arrived()
        room.hotter_busy(1)
        clock.now += 0.005
        room.hotter_busy(0)
        clock.now += 0.015
    assert 0.2 < room.load() < 0.3
    assert room.reserve() == 3  # ceil(0.25 + 3 * 0.5) + 1


def test_saturating_hotter_work_leaves_the_coldest_band_its_old_share() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    room.hotter_arrived()
    room.hotter_busy(12)
    clock.now += 5
    room.hotter_arrived()
    assert room.load() > 11.9
    assert room.reserve() == C - C // 4  # capped: cold may still hold max(2, C // 4) slots


def four_slots(cold: int) -> tuple[Clock, Headroom, Dispatcher[str]]:
    """A dispatcher of 4 slots and two bands with `cold` messages at hand in the colder."""
    clock = Clock()
    room = Headroom(4, idle_after=0.5, clock=clock)
    dispatch: Dispatcher[str] = Dispatcher(2, StrictPolicy(), 4, clock=clock, headroom=room)
    for n in range(cold):
        dispatch.put(1, f"cold{n}")
    return clock, room, dispatch


def test_the_dispatcher_starts_cold_work_only_outside_the_reserve() -> None:
    clock, room, dispatch = four_slots(10)
    assert [dispatch.take_nowait() for _ in range(5)] == [
        (1, "cold0"), (1, "cold1"), (1, "cold2"), (1, "cold3"), None,
    ]  # fmt: skip
    for n in range(4):
        dispatch.done(1, f"cold{n}")
    room.hotter_arrived()  # a hotter message arrives: one slot is kept free for the next
    dispatch.put(0, "hot0")
    assert dispatch.take_nowait() == (0, "hot0")
    assert dispatch.take_nowait() == (1, "cold4")
    assert dispatch.take_nowait() == (1, "cold5")
    assert dispatch.take_nowait() is None  # reserve 1 (plus the hot one running)
    dispatch.put(0, "hot1")
    assert dispatch.take_nowait() == (0, "hot1")  # the kept slot, at once
    clock.now += 0.6  # no hotter arrival since: the reserve is gone
    assert dispatch.take_nowait() is None  # every slot is busy now (2 hot, 2 cold)
    dispatch.done(0, "hot0")
    assert dispatch.take_nowait() == (1, "cold6")


def test_under_saturation_cold_work_keeps_its_floor_of_free_slots() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    room.hotter_arrived()
    room.hotter_busy(12)
    clock.now += 5
    room.hotter_arrived()
    assert room.admits(running=12, cold_running=0)
    assert room.admits(running=15, cold_running=3)
    assert not room.admits(running=15, cold_running=4)  # floor (C // 4) reached: reserve rules
    assert not room.admits(running=13, cold_running=4)


def test_slots_that_change_with_the_running_count_set_the_floor_and_the_reserve() -> None:
    """HTTP receivers: the slots are the open leases plus the receives waiting for a first
    message (`bandgate.pull.receiver`), so they change with every request."""
    clock = Clock()
    waiting = 0
    room = Headroom(256, idle_after=0.5, clock=clock, slots=lambda running: running + waiting)
    room.hotter_arrived()  # reserve: 1 (no hotter slot busy yet)
    waiting = 1
    assert room.admits(running=0, cold_running=0)  # under the floor of max(2, 1 // 4) = 2
    assert not room.admits(running=10, cold_running=10)  # the only waiting receive is kept
    waiting = 2
    assert room.admits(running=10, cold_running=10)  # one stays waiting after this one
    assert room.reserve(slots=12) == 1
    clock.now += 0.6  # no hotter arrival since: every waiting receive may take cold work
    waiting = 1
    assert room.admits(running=10, cold_running=10)


def test_a_batch_fill_may_take_cold_work_inside_the_headroom() -> None:
    _, room, dispatch = four_slots(5)
    room.hotter_arrived()  # reserve 1: the fourth slot stays free
    assert [dispatch.take_nowait() for _ in range(4)] == [
        (1, "cold0"), (1, "cold1"), (1, "cold2"), None,
    ]  # fmt: skip
    assert dispatch.take_nowait(headroom=False) == (1, "cold3")
    assert dispatch.take_nowait(headroom=False) is None  # no slot left at all

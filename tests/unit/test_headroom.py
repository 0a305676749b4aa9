"""The coldest band's headroom (`bandgate.consumers.scheduling`): the reserve follows hotter
work's share
of the starts, and the dispatcher keeps cold work off it."""

from __future__ import annotations

import math

import pytest

from bandgate.consumers.scheduling import WAIT_CHANCE, Dispatcher, Headroom, StrictPolicy, self_wait

C = 16


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run_for(
    room: Headroom,
    clock: Clock,
    seconds: float,
    hotter: float,
    colder: float,
    hold: float = 0.005,
) -> None:
    """`hotter` and `colder` starts per second, spread evenly over `seconds`, each message
    running `hold` seconds."""
    ends: list[tuple[int, bool]] = []
    for tick in range(round(seconds * 1000)):
        clock.now += 0.001
        for hot in [hot for end, hot in ends if end == tick]:
            room.ended(hotter=hot)
        ends = [(end, hot) for end, hot in ends if end > tick]
        for rate, hot in ((hotter, True), (colder, False)):
            for _ in range(math.floor((tick + 1) * rate / 1000) - math.floor(tick * rate / 1000)):
                room.started(hotter=hot)
                ends.append((tick + round(hold * 1000), hot))
                if hot:
                    room.hotter_arrived()


def test_no_reserve_until_hotter_work_arrives_and_none_after_it_stops() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    assert room.reserve() == 0  # a cold-only load fills every slot
    room.hotter_arrived()
    assert room.reserve() == 1  # nothing busy yet: one slot kept for the next arrival
    clock.now += 0.6
    assert room.reserve() == 0


def test_a_hot_reserve_keeps_its_slots_after_a_quiet_spell_and_no_more_than_the_cap() -> None:
    """`hot_reserve` is the least reserve, quiet or not; hotter traffic may ask for more; the
    coldest band's floor is never taken from it (16 slots: at most 12 reserved)."""
    clock = Clock()
    room = Headroom(C, idle_after=0.5, kept=2, clock=clock)
    assert room.reserve() == 2  # nothing hotter ever came
    run_for(room, clock, 2.0, hotter=800, colder=800)
    assert room.reserve() > 2  # hotter work on half the starts asks for more
    clock.now += 0.6
    assert room.reserve() == 2  # quiet again: the floor stays
    assert Headroom(C, idle_after=0.5, kept=15, clock=clock).reserve() == C - max(2, C // 4)
    assert not room.admits(running=C - 2, cold_running=C - 2)  # two slots stay free
    assert room.admits(running=C - 3, cold_running=C - 3)


def test_a_drained_hotter_backlog_gives_the_slots_back_sooner() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, quiet_after=0.1, clock=clock)
    room.hotter_arrived()
    clock.now += 0.05
    room.hotter_drained()
    clock.now += 0.06
    assert room.reserve() == 0


def test_a_drained_backlog_leaves_the_least_reserve_until_the_quiet_spell_ends() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, quiet_after=0.1, clock=clock)
    run_for(room, clock, 2.0, hotter=400, colder=0, hold=0.02)  # a warm backlog on 8 slots
    assert room.share() == pytest.approx(1.0)
    assert room.load() == pytest.approx(8, rel=0.05)
    assert room.reserve() == C - C // 4  # only hotter work starts: keep it all the slots
    clock.now += 0.01  # the broker says the band is empty, after its last message arrived
    room.hotter_drained()
    assert room.reserve() == 1  # the backlog's share says nothing of what arrives next
    clock.now += 0.11
    assert room.reserve() == 0


@pytest.mark.parametrize(
    ("hotter", "colder", "expected"),
    [
        (50, 2_450, 1),  # 0.02, the light load of `bench priority`: 0.02 / e < 0.01
        (100, 900, 2),  # 0.1: 0.1 / e > 0.01 > 0.1^2 / e
        (350, 650, 4),  # 0.35: 0.35^3 / e = 0.016, 0.35^4 / e = 0.006
    ],
)
def test_under_one_in_a_hundred_hotter_starts_wait_longer_than_one_gap_between_ends(
    hotter: float, colder: float, expected: int
) -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    run_for(room, clock, 3.0, hotter=hotter, colder=colder)
    share = room.share()
    assert share == pytest.approx(hotter / (hotter + colder), rel=0.05)
    assert room.reserve() == expected
    assert share**expected / math.e <= WAIT_CHANCE
    assert expected == 1 or share ** (expected - 1) / math.e > WAIT_CHANCE


def test_the_erlang_c_chance_of_waiting() -> None:
    assert self_wait(2, 1.0) == pytest.approx(1 / 3)  # M/M/2 at half load
    assert self_wait(1, 0.5) == pytest.approx(0.5)  # M/M/1: the utilisation
    assert self_wait(12, 12.5) == 1.0  # more work than slots: every arrival waits
    assert self_wait(12, 0.25) < 1e-12


@pytest.mark.parametrize(
    ("hotter", "colder", "expected"),
    [
        (560, 230, 1),  # hot on 11.2 of 16 slots: it waits for its own 12 with chance 0.75
        (400, 300, 4),  # 8 slots: its own wait 0.14, share 0.57, and 0.57^4 = 0.11
        (240, 400, 4),  # 4.8 slots: own wait 0.0014, so e / 100 rules: 0.375^4 = 0.020
    ],
)
def test_the_reserve_buys_no_more_than_hotter_work_s_own_wait(
    hotter: float, colder: float, expected: int
) -> None:
    """Cold work may always hold C // 4 slots, so hotter work waits for its own 12 with the
    Erlang C chance; a reserve keeping the chance of waiting for cold work far below that
    would only keep slots idle."""
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    run_for(room, clock, 3.0, hotter=hotter, colder=colder, hold=0.02)
    assert room.load() == pytest.approx(hotter * 0.02, rel=0.05)
    target = max(math.e * WAIT_CHANCE, self_wait(C - C // 4, room.load()))
    assert room.reserve() == expected
    assert room.share() ** expected <= target
    assert expected == 1 or room.share() ** (expected - 1) > target


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
    room.hotter_arrived()  # a hotter message arrives: 1 start in 5 is hotter now
    dispatch.put(0, "hot0")
    assert dispatch.take_nowait() == (0, "hot0")
    assert room.reserve() == 2  # 0.2^3 < 0.01, capped at 4 - max(2, 4 // 4)
    assert dispatch.take_nowait() == (1, "cold4")
    assert dispatch.take_nowait() == (1, "cold5")  # cold work under its floor of 2
    assert dispatch.take_nowait() is None  # the last free slot is hotter work's
    dispatch.put(0, "hot1")
    assert dispatch.take_nowait() == (0, "hot1")  # the kept slot, at once
    clock.now += 0.6  # no hotter arrival since: the reserve is gone
    assert dispatch.take_nowait() is None  # every slot is busy now (2 hot, 2 cold)
    dispatch.done(0, "hot0")
    assert dispatch.take_nowait() == (1, "cold6")


def test_under_saturation_cold_work_takes_every_slot_but_one() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    run_for(room, clock, 3.0, hotter=560, colder=230, hold=0.02)
    assert room.admits(running=12, cold_running=0)
    assert room.admits(running=15, cold_running=3)  # under the floor (C // 4)
    assert room.admits(running=14, cold_running=5)  # over it, with one slot left free
    assert not room.admits(running=15, cold_running=5)  # the last free slot is hotter work's


def test_a_moderate_hotter_load_keeps_cold_work_off_more_slots() -> None:
    clock = Clock()
    room = Headroom(C, idle_after=0.5, clock=clock)
    run_for(room, clock, 3.0, hotter=240, colder=400, hold=0.02)
    assert room.admits(running=11, cold_running=5)  # 4 stay free after it
    assert not room.admits(running=12, cold_running=5)


def test_slots_that_change_with_the_running_count_set_the_floor_and_the_reserve() -> None:
    """HTTP receivers: the slots are the open leases plus the receives waiting for a first
    message (`bandgate.pull.receiver`), so they change with every request."""
    clock = Clock()
    room = Headroom(256, idle_after=0.5, clock=clock)
    room.takers_waiting(0)
    room.hotter_arrived()  # reserve: 1 (no hotter slot busy yet)
    room.takers_waiting(1)
    assert room.admits(running=0, cold_running=0)  # under the floor of max(2, 1 // 4) = 2
    assert not room.admits(running=10, cold_running=10)  # the only waiting receive is kept
    room.takers_waiting(2)
    assert room.admits(running=10, cold_running=10)  # one stays waiting after this one
    assert room.reserve(slots=12) == 1
    clock.now += 0.6  # no hotter arrival since: every waiting receive may take cold work
    room.takers_waiting(1)
    assert room.admits(running=10, cold_running=10)


def test_a_batch_fill_may_take_cold_work_inside_the_headroom() -> None:
    _, room, dispatch = four_slots(5)
    room.hotter_arrived()  # reserve 1: the fourth slot stays free
    assert [dispatch.take_nowait() for _ in range(4)] == [
        (1, "cold0"), (1, "cold1"), (1, "cold2"), None,
    ]  # fmt: skip
    assert dispatch.take_nowait(headroom=False) == (1, "cold3")
    assert dispatch.take_nowait(headroom=False) is None  # no slot left at all

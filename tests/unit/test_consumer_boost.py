"""The coldest band's prefetch as hotter work comes and goes (`consumers.boost`), no broker."""

from __future__ import annotations

from consumers.boost import ColdBoost
from consumers.subscription import Subscription


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def never(_: object) -> None:  # the deliveries of a subscription never opened
    raise AssertionError("no delivery expected")


def boost(clock: Clock, concurrency: int = 16) -> ColdBoost:
    cold = Subscription(2, "orders.cold", prefetch=max(2, concurrency // 4), single_active=False)
    return ColdBoost(
        cold, never, concurrency=concurrency, full=2 * concurrency, idle_after=0.5, clock=clock
    )


def test_no_hotter_work_for_the_idle_time_gives_every_slot() -> None:
    clock = Clock()
    cold = boost(clock)
    assert cold.target() == 14  # no hotter work seen yet: a reserve of two slots
    clock.now += 0.5
    assert cold.target() == 32


def test_the_first_hotter_message_after_a_pause_shrinks_at_once() -> None:
    clock = Clock()
    cold = boost(clock)
    cold.subscription.prefetch = 32
    assert cold.boosted
    cold.hotter_arrived()
    assert cold.target() == 4


def test_light_hotter_work_leaves_the_rest_to_cold() -> None:
    clock = Clock()
    cold = boost(clock)
    cold.hotter_arrived()  # one hot message at hand at a time: reserve 2 * 1 + 2
    cold.hotter_done()
    assert cold.target() == 12
    cold.subscription.prefetch = 12
    for _ in range(3):  # three at once: reserve 8, and a shrink happens at any size
        cold.hotter_arrived()
    assert cold.target() == 8


def test_heavy_hotter_work_keeps_the_small_prefetch() -> None:
    cold = boost(Clock())
    for _ in range(10):
        cold.hotter_arrived()
    assert cold.target() == 4


def test_growing_takes_a_step_of_a_quarter_of_the_slots() -> None:
    cold = boost(Clock())
    for _ in range(4):
        cold.hotter_arrived()  # reserve 10: 6 wanted, only 2 above the small 4
    assert cold.target() == 4

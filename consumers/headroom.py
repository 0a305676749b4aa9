"""Headroom: how many slots the coldest band leaves free for hotter work.

The coldest band is consumed with the full prefetch (`2C`) and the dispatcher, not the
broker, keeps it from taking every slot: it starts a cold message only while at least
`reserve()` slots stay free after it. The reserve follows what hotter work uses, measured in
the dispatcher itself: the time-average number of slots hotter bands occupy (`load`, which by
Little's law is their arrival rate times their handler time, with no need to know either),
plus a margin for bursts, as for Poisson arrivals:

    reserve = ceil(load + 3 * sqrt(load)) + 1,   at most C - floor,

where `floor = max(2, C // 4)`: however busy hotter bands are, the coldest band may hold
`floor` slots whenever they are free, as its old fixed prefetch let it (`admits`). After
`idle_after` seconds without a hotter arrival (or `quiet_after` once a hotter band's backlog
drained on the broker), the reserve is 0 and cold work fills every slot.

Only where it is safe and needed (`consumers.options.keeps_headroom`): the strict policy,
more than one band, the coldest band's default prefetch (an override keeps that prefetch and
no headroom), one competing consumer queue for it (not sharded, not ordered), and
`idle_after` > 0 (0 keeps the coldest band at its small prefetch, as before the headroom).

The slots are the worker's concurrency `C`. For HTTP receivers (`bandgate.pull`) they are the
seats clients ask for, which change with every request: `slots(running)` gives them, and the
floor and the cap follow.

This replaced the cold boost, which resized the coldest band's prefetch (re-subscribing it on
the broker) between `max(2, C // 4)` and `2C`: under a hot trickle the boost never came, so
cold work ran on a quarter of the slots. Here nothing talks to the broker: the reserve changes
with every hotter start and finish at no cost. `python -m bench priority` measured both
(README, Benchmarks).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

AVERAGE_SECONDS = 1.0  # time constant of the hotter bands' busy-slot average
MARGIN = 3.0  # standard deviations of Poisson arrivals kept free above the average
IDLE_AFTER = 0.5  # default seconds without a hotter arrival before cold work fills every slot


def floor(slots: int) -> int:
    """The slots the coldest band may always hold, however busy hotter bands are."""
    return max(2, slots // 4)


class Headroom:
    def __init__(
        self,
        concurrency: int,
        *,
        idle_after: float,
        quiet_after: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        slots: Callable[[int], int] | None = None,
    ) -> None:
        """`slots(running)`: the slots there are while `running` are busy (default: a fixed
        `concurrency`)."""
        self.concurrency = concurrency
        self._slots = slots
        self.idle_after = idle_after
        self.quiet_after = min(quiet_after, idle_after)
        self._clock = clock
        now = clock()
        self._last_hotter = float("-inf")
        self._drained_at = float("-inf")
        self._busy = 0  # slots hotter bands hold now
        self._average = 0.0
        self._since = now

    def hotter_arrived(self) -> None:
        self._last_hotter = self._clock()

    def hotter_drained(self) -> None:
        """A hotter band's backlog ended on the broker: no reserve after `quiet_after`, and
        until then one sized from the slots hotter work holds now. The average remembers the
        backlog, which says nothing of what arrives next."""
        self._drained_at = self._clock()
        self._advance()
        self._average = float(self._busy)

    def hotter_busy(self, busy: int) -> None:
        """Hotter bands now hold `busy` slots (called at each of their starts and ends)."""
        self._advance()
        self._busy = busy

    def load(self) -> float:
        """The time-average of the slots hotter bands held lately."""
        self._advance()
        return self._average

    def admits(self, running: int, cold_running: int) -> bool:
        """Whether a free slot may start a cold message, with `running` slots busy of which
        `cold_running` run cold ones."""
        slots = self.concurrency if self._slots is None else self._slots(running)
        return cold_running < floor(slots) or running + self.reserve(slots) < slots

    def reserve(self, slots: int | None = None) -> int:
        """Slots to keep free of cold work, of `slots` (default: the concurrency)."""
        if self.idle_until() is None:
            return 0
        slots = self.concurrency if slots is None else slots
        load = self.load()
        return min(max(0, slots - floor(slots)), math.ceil(load + MARGIN * math.sqrt(load)) + 1)

    def idle_until(self) -> float | None:
        """When the reserve drops to 0 for want of hotter arrivals (None: it is 0 now)."""
        drained = self._drained_at > self._last_hotter
        until = self._last_hotter + (self.quiet_after if drained else self.idle_after)
        return until if self._clock() < until else None

    def _advance(self) -> None:
        """Bring the average up to now: `_busy` slots were held since the last change."""
        now = self._clock()
        weight = math.exp(-max(0.0, now - self._since) / AVERAGE_SECONDS)
        self._average = self._average * weight + self._busy * (1 - weight)
        self._since = now


__all__ = ["IDLE_AFTER", "Headroom", "floor"]

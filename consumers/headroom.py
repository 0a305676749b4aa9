"""Headroom: how many slots the coldest band leaves free for hotter work.

The coldest band is consumed with the full prefetch (`2C`) and the dispatcher, not the
broker, keeps it from taking every slot: it starts a cold message only while at least
`reserve()` slots stay free after it.

How big the reserve must be. Cold work fills the slots up to `C - r` (`r` the reserve); from
there the free slots `F` move one at a time: a hotter start takes one (`F - 1`), and any
message's end gives one back while `F < r` (a cold end is not replaced). That is a
birth-death chain on `0..r`, with hotter arrivals at rate `lambda` and ends at rate `mu` (the
rate of all starts, in a steady state), so a hotter arrival finds no free slot with chance

    P(F = 0) = rho^r (1 - rho) / (1 - rho^(r+1)) <= rho^r,    rho = lambda / mu,

where `rho` is the hotter share of all starts, which the dispatcher measures itself (a
time-average over `AVERAGE_SECONDS`, counting its starts). A hotter message that finds none
takes the next slot to end, before any cold message (the strict policy starts the hottest at
hand); ends come at rate `mu`, so it waits longer than `t` with chance about
`rho^r e^(-mu t)`. The bound is on that time: at most `WAIT_CHANCE` (1 in 100) of hotter
messages wait longer than `1 / mu`, the mean gap between two ends (`d / C` for handlers of `d`
seconds: 0.37 ms for 5 ms handlers at 2,700 starts/s), that is `rho^r <= e WAIT_CHANCE`.

No reserve does better than hotter work does by itself. The coldest band may always hold
`floor = max(2, C // 4)` slots (`admits`: what its old fixed prefetch gave it), so hotter work
has `C - floor` slots at most; with `a` of them busy on average (its offered load: the
time-average of the slots it holds) its arrivals find them all busy with the Erlang C chance
`self_wait(C - floor, a)`, whatever the reserve. So the reserve is the smallest `r >= 1` with

    rho^r <= target,    target = max(e WAIT_CHANCE, self_wait(C - floor, a)),
    reserve = max(1, ceil(ln target / ln rho)),   at most C - floor:

under 1 in 100 hotter messages wait longer than `1 / mu` for cold work's slots, or, where
hotter work alone makes more than that wait, waiting for cold work's slots is no likelier than
waiting for its own. Light hot traffic beside a cold backlog (`rho` = 0.02: 50/s among 2,500
starts/s; `a` = 0.25) keeps 1 slot: 2 in 100 hot messages find none free and wait for the
next end. Hotter work on 70 % of the slots (`a` = 11.2 of 16, `rho` about 0.7) waits for its
own 12 slots with chance 0.75, so its reserve is 1 too: more would start some hotter messages
sooner, not the 99th percentile, and keep idle slots cold work could run on. In between the
reserve grows: 2 slots at `rho` = 0.1, 4 at 0.35. After `idle_after` seconds without a hotter
arrival (or `quiet_after` once a hotter band's backlog drained on the broker), the reserve is 0
and cold work fills every slot.

Only where it is safe and needed (`consumers.options.keeps_headroom`): the strict policy,
more than one band, the coldest band's default prefetch (an override keeps that prefetch and
no headroom), one competing consumer queue for it (not sharded, not ordered), and
`idle_after` > 0 (0 keeps the coldest band at its small prefetch, as before the headroom).

The slots are the worker's concurrency `C`. For HTTP receivers (`bandgate.pull`) they are the
seats clients ask for, which change with every request: `slots(running)` gives them, and the
floor and the cap follow.

This replaced three designs, all measured by `python -m bench priority` (README, Benchmarks):
the cold boost, which resized the coldest band's prefetch on the broker between
`max(2, C // 4)` and `2C` (under a hot trickle the boost never came, so cold work ran on a
quarter of the slots); a reserve sized from the slots hotter work holds (`m + 3 sqrt(m) + 1`,
`m` their average), which kept 3 slots at the light load: slots hotter work holds are not free
slots, and cold work gives them back as it ends; and `rho^r <= 1 %` alone, which kept 2 there
and, under saturation, `C - floor`, holding cold work to its floor while hotter work waited
for its own slots anyway.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

AVERAGE_SECONDS = 1.0  # time constant of the measured hotter share of starts and load
WAIT_CHANCE = 0.01  # at most this share of hotter starts waits longer than one end's gap
IDLE_AFTER = 0.5  # default seconds without a hotter arrival before cold work fills every slot


def floor(slots: int) -> int:
    """The slots the coldest band may always hold, however busy hotter bands are."""
    return max(2, slots // 4)


def cap(slots: int) -> int:
    """The most slots the reserve keeps free: all but the coldest band's floor."""
    return max(0, slots - floor(slots))


def self_wait(servers: int, load: float) -> float:
    """Erlang C: the chance an arrival finds all `servers` busy with an offered `load` (the
    average busy count): how often hotter work waits for its own slots, whatever the reserve."""
    if load >= servers:
        return 1.0
    blocked = 1.0  # Erlang B, by its recurrence over the servers
    for server in range(1, servers + 1):
        blocked = load * blocked / (server + load * blocked)
    return servers * blocked / (servers - load * (1.0 - blocked))


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
        self._last_hotter = float("-inf")
        self._drained_at = float("-inf")
        self._hotter_starts = 0.0  # time-decayed counts of starts
        self._all_starts = 0.0
        self._hotter_held = 0  # slots hotter work holds now
        self._hotter_load = 0.0  # their time-decayed integral, over that of the time
        self._measured = 0.0
        self._since = clock()

    def hotter_arrived(self) -> None:
        self._last_hotter = self._clock()

    def hotter_drained(self) -> None:
        """A hotter band's backlog ended on the broker: no reserve after `quiet_after`, and
        until then the least one. The share of starts remembers the backlog, which says
        nothing of what arrives next."""
        self._drained_at = self._clock()
        self._hotter_starts = self._all_starts = 0.0

    def started(self, hotter: bool) -> None:
        """A slot started a message, of a hotter band or of the coldest."""
        self._advance()
        self._all_starts += 1
        if hotter:
            self._hotter_starts += 1
            self._hotter_held += 1

    def ended(self, hotter: bool) -> None:
        """A slot's message ended, of a hotter band or of the coldest."""
        if hotter:
            self._advance()
            self._hotter_held = max(0, self._hotter_held - 1)

    def share(self) -> float:
        """The hotter share of the starts lately (0 before any)."""
        self._advance()
        return self._hotter_starts / self._all_starts if self._all_starts > 0 else 0.0

    def load(self) -> float:
        """The slots hotter work held lately, on average (its offered load)."""
        self._advance()
        return self._hotter_load / self._measured if self._measured > 0 else 0.0

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
        most = cap(slots)
        share = self.share()
        target = math.e * WAIT_CHANCE
        if share > target:  # only then can hotter work's own wait raise the target
            target = max(target, self_wait(most, self.load()))
        if share <= target:
            return min(most, 1)
        if share >= 1.0:
            return most
        return min(most, math.ceil(math.log(target) / math.log(share)))

    def idle_until(self) -> float | None:
        """When the reserve drops to 0 for want of hotter arrivals (None: it is 0 now)."""
        drained = self._drained_at > self._last_hotter
        until = self._last_hotter + (self.quiet_after if drained else self.idle_after)
        return until if self._clock() < until else None

    def _advance(self) -> None:
        """Age the counts and the load's average up to now."""
        now = self._clock()
        weight = math.exp(-max(0.0, now - self._since) / AVERAGE_SECONDS)
        self._hotter_starts *= weight
        self._all_starts *= weight
        self._hotter_load = self._hotter_load * weight + self._hotter_held * (1.0 - weight)
        self._measured = self._measured * weight + (1.0 - weight)
        self._since = now


__all__ = ["IDLE_AFTER", "Headroom", "cap", "floor", "self_wait"]

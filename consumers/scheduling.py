"""Scheduling: which band, which shard and which message a free slot starts next.

Everything that answers it lives here: the band policy (`strict` waterfall or `weighted`
shares), the prefetch per band, the shard merge inside a band, the headroom that keeps the
coldest band off the slots hotter work needs, per-key order, the refill wait and the probe that
asks the broker whether a band that ran dry has more. The runner (`bandgate.consumers.runner`)
puts every delivery into its band's buffer here and takes what `Dispatcher.take` hands a free
slot; the slot stays taken until `Dispatcher.done`.

Waterfall dispatch
------------------
Every band of a queue is consumed on its own channel with its own prefetch, so each band keeps a
small buffer of messages "at hand" in the worker. The dispatcher owns those buffers and the
worker's `C` slots (the concurrency) and, each time a slot is free and some band has a message at
hand, lets the policy pick the band:

- `strict` (default): the hottest band with a message at hand. A colder message starts only when
  no hotter one is at hand.
- `weighted`: smooth weighted round robin over the bands that have a message at hand, with the
  shares of `QueueSpec.weights()` (8:4:2:1 style). Under saturation every band gets its share of
  starts; a band without work lends its share to the others instead of saving it up.

Messages with the same partition key in one band start one at a time, in order: a message whose
key is running is not "at hand", and the next one in the buffer may start instead. Within a
sharded band, a free slot starts the best head among the shards' buffers: highest priority,
then oldest ("Shard merge" below).

Prefetch, refills and the inversion window (strict)
---------------------------------------------------
The broker counts a band's prefetch `P` against the messages the worker holds, running ones
included: a band never runs more than `P` messages at once, and its buffer holds `P - running`
minus the refills not yet arrived. The broker sends a refill only after it has processed an ack;
on a quorum queue that is a Raft commit, which takes about 1 ms idle but was seen to stall for
20-40 ms on a busy two-core machine. Defaults (`default_prefetch`, `C` = concurrency, `d` =
handler duration, `R` = refill latency from ack to next delivery):

- every band but the coldest: `P = 2C`. With all `C` slots on the band, `C` more messages wait
  at hand, enough while `d > R * C / (P - C)` (`d > R` at `P = 2C`).
- the coldest band: `P = 2C` too, but it shares the slots through a headroom
  ("Headroom" below): a cold message starts only while cold work holds fewer than
  `f = max(2, C // 4)` slots, or while `reserve` slots stay free after it: `reserve =
  min(C - f, max(1, ceil(ln t / ln rho)))`, `t = max(e/100, ErlangC(C - f, a))`, with `rho`
  the hotter bands' share of the starts and `a` the slots they held on average, over the last
  second; `reserve = 0` after `cold_boost_seconds` (0.5 s) without a hotter arrival (the
  refill wait, once a hotter backlog drained on the broker). Where the headroom does not apply
  (an override `prefetch={"cold": n}`, a sharded or ordered coldest band,
  `cold_boost_seconds = 0`), the coldest band keeps `P = max(2, C // 4)`.

  The bound on a hotter message's wait for a slot: cold work fills the slots up to
  `C - reserve`, then a hotter start takes a free slot and any end gives one back (a cold end
  is not replaced while fewer than `reserve` are free): a birth-death chain on `0..reserve`,
  down at the hotter arrival rate `lambda`, up at the end rate `mu`. A hotter arrival finds no
  slot because of cold work with chance at most `rho^reserve` (`rho = lambda / mu`), then
  takes the next slot to end before any cold message: it waits longer than one gap between
  ends (`1 / mu`, `d / C`) with chance about `rho^reserve / e`, under 1 in 100 by the choice
  of `reserve`, and at most `d`. Hotter work alone (on its `C - f` slots at most) makes it wait
  with chance `ErlangC(C - f, a)` whatever the reserve, and the reserve stops there (1 at 70 %
  of the slots: `ErlangC(12, 11.2)` = 0.75 > `rho`); after an idle spell, `d` at most.
- refill wait `H` (`WorkerSettings.refill_wait_seconds`, 0.1 s): a band that had a backlog at
  hand and runs dry keeps its claim on free slots for up to `H`, because its refill is most
  likely on the way; when a free slot waits for it, the worker asks the broker (passive
  declare) and drops the claim when the band is really empty. This covers refill stalls
  shorter than `H + d`.

An inversion is a colder message starting while a hotter one is ready on the broker. With the
above, it happens only (a) in the delivery latency `L` (about half a round trip) after a hotter
message becomes ready in a band that was idle, or (b) when a refill stalls longer than `H + d`.
In either window free slots take what is at hand; a slot frees at most once in `L` and only
messages already held can start, so per such event the inversion window of band `i` is

    W_i = min(C, sum of P_j over the bands j colder than i)    messages,

and about `C * L / d` on average (a fraction of a message for handlers of a few milliseconds).
With the defaults and three bands, `W_hot = min(C, 2C + 2C) = C`, and `W_warm` is what the
headroom lets the coldest band start: at most `C - reserve` (`max(2, C // 4)` where the
headroom does not apply). At start-up the worker consumes the bands hottest first, waits for
each band's first prefetch to arrive, and only then starts dispatching, so a backlog present at
start-up adds no inversion (unless that wait, `startup_prime_seconds`, times out). `weighted`
has no such window: it starts colder messages on purpose, at their share.

Shard merge
-----------
A band's buffer holds one sequence per queue of the band, and merges over their heads.
A sharded band is N quorum queues (`QueueSpec.band_queues`). Each shard delivers in its own
broker order: by priority on RabbitMQ 4.3 (strict, up to 32 levels), 5-9 ahead of 0-4 on 4.0,
publish order on 3.10. Kept in one arrival-ordered buffer, the shards would reach the slots in
whatever order their deliveries happened to arrive, so a priority 2 message of one shard could
start while a priority 9 message of another waited at hand. So each shard's deliveries are kept
in a sequence of their own, in arrival order (its broker order), and a free slot starts the best
head among them: highest priority, then oldest enqueue time, then the lowest shard (`Rank`).
Comparing the heads is enough, O(shards) per pick: the broker delivered each shard's head first
because it ranked first among what that shard had ready then.

Per-key order holds: a key's messages all come from one shard, in its order, and a shard's head
is its first buffered message whose key is not running (`busy`), so the first message of a key
at hand is its oldest ("Waterfall dispatch"). A band of one queue is one sequence in arrival
order, as before the merge. `ShardMerge` tells the dispatcher how many queues each band has,
which queue an item came from and how it ranks; without one every band is one sequence.

Headroom
--------
How many slots the coldest band leaves free for hotter work.
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

A consumer that must bound the first hotter message's wait after a quiet spell keeps a floor
(`hot_reserve`; `BANDGATE_PULL_HOT_RESERVE` for HTTP receivers): the reserve is never below
it (nor above `C - floor`), quiet or not. That message then finds a slot free (over HTTP, a
receive waiting, where the receivers keep one waiting) instead of waiting for a cold message
to end, which is the handler's time or a cold lease's (3 s in the case that asked for it). Its
cost: cold work runs on `C - hot_reserve` slots at most, its drain that much slower when the
handlers, not the broker, set the pace.

Only where it is safe and needed (`keeps_headroom`): the strict policy,
more than one band, the coldest band's default prefetch (an override keeps that prefetch and
no headroom), one competing consumer queue for it (not sharded, not ordered), and
`idle_after` > 0 or a `hot_reserve` (with neither, the coldest band keeps its small prefetch,
as before the headroom).

The slots are the worker's concurrency `C`. Where takers come and go (a runner its caller
drives with `take`, as HTTP receivers do: `bandgate.pull`), they are the messages running and
the takers waiting for one (`Headroom.takers_waiting`), and the floor and the cap follow.

This replaced three designs, all measured by `python -m bench priority` (README, Benchmarks):
the cold boost, which resized the coldest band's prefetch on the broker between
`max(2, C // 4)` and `2C` (under a hot trickle the boost never came, so cold work ran on a
quarter of the slots); a reserve sized from the slots hotter work holds (`m + 3 sqrt(m) + 1`,
`m` their average), which kept 3 slots at the light load: slots hotter work holds are not free
slots, and cold work gives them back as it ends; and `rho^r <= 1 %` alone, which kept 2 there
and, under saturation, `C - floor`, holding cold work to its floor while hotter work waited
for its own slots anyway.

Noisy lane
----------
A `fair` band is two queues, its own and its noisy lane (`QueueSpec.band_queues`), where the
publishers send the messages of the tenants they found noisy (`bandgate.core.fairness`). The
band's buffer keeps a sequence for each, and a free slot starts the band's queue's head first,
the lane's when the band's queue has nothing at hand, and the lane's once in every `LANE_EVERY`
starts of the band while both have work (`BandBuffer`), so the noisy tenant is never starved:
it gets at least 1 in `LANE_EVERY` of the band's starts however busy the quiet tenants keep it.
One band for the waterfall: the lane ranks with its band.

Not work-conserving while quiet tenants publish: the band's own queue keeps a pool of slots
from the lane (`QuietPool`). With every slot the quiet tenants leave taken by the flood, a
quiet message waits for a slot to end, and with handlers of about the same length the flood's
slots end in the clusters they started in (each end starts the next flood message at once), so
a quiet message arriving between two clusters waits up to a handler's time: one kept slot (the
previous design) covers the first message of such a gap, not the next ones. Measured on one
worker (`python -m bench tenants`, 20 ms handlers, quiet tenants on 60 % of the 16 slots), the
quiet messages waited in the worker's buffer 4 ms at the median and 20 ms at the 99th
percentile under the flood, against 0.3 and 6 ms without it, and 2-4 kept slots changed the
99th percentile by nothing.

So the pool follows the quiet tenants' load: `a` the slots the band's own messages held on
average over the last `AVERAGE_SECONDS` (since their first arrival after an idle spell, none
running and none arriving for `IDLE_AFTER`, when that is later: an idle spell says nothing of
the load that comes), the pool is
`ceil(a + LANE_SPREAD sqrt(a))` slots (`LANE_SPREAD` = 0.5: their mean load and half a
standard deviation of it), and the
lane starts only while the pool's slots the band's own messages do not hold now, and
`LANE_KEEPS` at the least, stay free after it (with the headroom's reserve for hotter bands on
top). That holds with `C >= LANE_KEEPS_FROM` slots, while the band's own queue had an arrival
in the last `IDLE_AFTER` seconds, and unless it is the lane's turn, so the lane keeps its 1 in
`LANE_EVERY` and every slot once the quiet tenants stop. Where the slots are takers that come
and go (HTTP receivers: the leases and the receives waiting), the pool's free slots are
receives left waiting, and its margin is `TAKERS_LANE_SPREAD` = 2.0 standard deviations:
a loop between its ack and its next receive holds no lease, so the quiet tenants' load reads
low, and a burst of their messages finds only the receives waiting right then (16 HTTP loops
under the benchmark's flood: quiet p99 median 26 ms at 2.0 against 50 at 0.5).

The cost is the pool's free slots, idle while the flood waits: taken from the noisy tenant
only, during the flood, and zero when nobody is noisy (an empty lane asks for nothing). In
tests/unit/test_fairness.py's simulation (handlers of 50 ms on average, exponential; quiet
tenants on 30 % and 54 % of the slots) the band starts 19 % and 9 % fewer messages than with a
lane that keeps nothing, while the flood lasts (12 % and 6 % without the margin). In the
benchmark (`python -m bench tenants`) on a fast machine, the quiet tenants' p99 under a flood
was 2.0-2.5 times their calm p99 without the margin, 1.1 with 0.5 or 1.0, and the band drained
0.94 of fairness off at 0.5 against 0.92 at 1.0: hence 0.5 (the runs: bench/RESULTS.md).

Fair bands are refused on ordered queues (a tenant moving to the lane would reorder its keys),
so per-key order is not at stake.

Refill probe
------------
Asking the broker whether a band that ran dry has more: the dispatcher's `questions`.
A band that had a backlog and ran dry keeps its claim on free slots for the refill wait, since
its refill is most likely on the way ("Waterfall dispatch"). When a free slot waits for it, the
probe asks the broker (a passive declare on its own channel): if no queue of the band has a
message ready, the dispatcher stops waiting (`Dispatcher.refill_ended`) and the headroom learns that
the hotter work is done. Only queues this worker is the active consumer of can refill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar, get_args

from aio_pika.abc import AbstractChannel

from bandgate.consumers.lifetime import Lifetime
from bandgate.consumers.message import read_enqueued_millis, read_priority
from bandgate.consumers.subscription import Delivery, Subscription
from bandgate.topology.model import QueueSpec

log = logging.getLogger(__name__)

PolicyName = Literal["strict", "weighted"]
POLICIES: tuple[str, ...] = get_args(PolicyName)

T = TypeVar("T")

AVERAGE_SECONDS = 1.0  # time constant of the measured hotter share of starts and load
WAIT_CHANCE = 0.01  # at most this share of hotter starts waits longer than one end's gap
IDLE_AFTER = 0.5  # default seconds without a hotter arrival before cold work fills every slot
# A fair band's noisy lane starts at least 1 in this many of the band's messages while the
# band's own queue has work too: a noisy tenant keeps 10 % of the band, a tenant's share of
# ten, however busy the quiet tenants are.
LANE_EVERY = 10
LANE = 1  # a fair band's noisy lane: its second queue
# With this many slots or more, the lane leaves free slots to the band's own queue while that
# had an arrival lately ("Noisy lane"): at least `LANE_KEEPS`, and as many as the band's own
# queue's recent load asks for (`QuietPool`).
LANE_KEEPS_FROM = 8
LANE_KEEPS = 1  # slots the lane leaves free for the band's own queue, at the least
# The band's own queue keeps `ceil(a + LANE_SPREAD * sqrt(a))` slots from the lane, `a` the
# slots its messages held on average lately (`QuietPool`): its mean load and a margin of half
# a standard deviation of it (square-root staffing). Without the margin, on a fast machine the
# quiet tenants' p99 under a flood was 2.0-2.5 times their calm p99 ("Noisy lane").
LANE_SPREAD = 0.5
# The margin where the slots are takers that come and go (HTTP receivers), whose quiet load
# reads low ("Noisy lane"; the runs behind 2.0: bench/RESULTS.md, 2026-11-27 14:27 UTC).
TAKERS_LANE_SPREAD = 2.0


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
        kept: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`kept`: slots the reserve keeps free at the least, quiet or not (`hot_reserve`)."""
        self.concurrency = concurrency
        self.kept = kept
        self._waiting: int | None = None  # takers waiting; None: the slots are `concurrency`
        self.idle_after = idle_after
        self.quiet_after = min(quiet_after, idle_after)
        self._clock = clock
        self._last_hotter = float("-inf")
        self._drained_at = float("-inf")
        self._hotter_starts = 0.0  # time-decayed counts of starts
        self._all_starts = 0.0
        self._since = clock()
        self._hotter = HeldLoad(clock)  # the slots hotter work holds, and held lately

    def takers_waiting(self, count: int) -> None:
        """From now on the slots are the messages running and `count` takers waiting for
        one, not the concurrency."""
        self._waiting = count

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
            self._hotter.started()

    def ended(self, hotter: bool) -> None:
        """A slot's message ended, of a hotter band or of the coldest."""
        if hotter:
            self._hotter.ended()

    def share(self) -> float:
        """The hotter share of the starts lately (0 before any)."""
        self._advance()
        return self._hotter_starts / self._all_starts if self._all_starts > 0 else 0.0

    def load(self) -> float:
        """The slots hotter work held lately, on average (its offered load)."""
        return self._hotter.load()

    def slots(self, running: int) -> int:
        """The slots with `running` busy: the concurrency, or those and the takers waiting."""
        return self.concurrency if self._waiting is None else running + self._waiting

    def admits(self, running: int, cold_running: int, slots: int | None = None) -> bool:
        """Whether a free slot may start a cold message, with `running` slots busy of which
        `cold_running` run cold ones (`slots`: of that many, default `slots(running)`)."""
        slots = self.slots(running) if slots is None else slots
        return cold_running < floor(slots) or running + self.reserve(slots) < slots

    def reserve(self, slots: int | None = None) -> int:
        """Slots to keep free of cold work, of `slots` (default: the concurrency): what the
        hotter bands' recent work asks for, and `kept` at the least."""
        slots = self.concurrency if slots is None else slots
        return max(min(self.kept, cap(slots)), self._wanted(slots))

    def _wanted(self, slots: int) -> int:
        """The reserve hotter work's recent arrivals ask for (0 after a quiet spell)."""
        if self.idle_until() is None:
            return 0
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
        """Age the counts of starts up to now."""
        now = self._clock()
        weight = math.exp(-max(0.0, now - self._since) / AVERAGE_SECONDS)
        self._hotter_starts *= weight
        self._all_starts *= weight
        self._since = now


class HeldLoad:
    """Slots some kind of work holds now, and held on average over the last `AVERAGE_SECONDS`
    (time-decayed): its offered load. The headroom's hotter work, a fair band's own queue."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.held = 0
        self._load = 0.0  # the held slots' time-decayed integral, over that of the time
        self._measured = 0.0
        self._since = clock()

    def started(self) -> None:
        self._advance()
        self.held += 1

    def ended(self) -> None:
        self._advance()
        self.held = max(0, self.held - 1)

    def restart(self) -> None:
        """Measure afresh from now."""
        self._advance()
        self._load = self._measured = 0.0

    def load(self) -> float:
        """The slots held lately, on average (0 before any time passed)."""
        self._advance()
        return self._load / self._measured if self._measured > 0 else 0.0

    def _advance(self) -> None:
        now = self._clock()
        weight = math.exp(-max(0.0, now - self._since) / AVERAGE_SECONDS)
        self._load = self._load * weight + self.held * (1.0 - weight)
        self._measured = self._measured * weight + (1.0 - weight)
        self._since = now


class QuietPool(HeldLoad):
    """The slots a fair band's own queue keeps from its noisy lane ("Noisy lane"): a pool of
    `a + spread * sqrt(a)` slots, `a` the slots the band's own messages held on average
    over the last `AVERAGE_SECONDS` (their offered load), of which the lane leaves free those
    they do not hold now, and `LANE_KEEPS` at the least. `restart` when the band's own queue
    is busy again after an idle spell: the idle spell says nothing of the load that comes."""

    spread = LANE_SPREAD  # standard deviations of margin (`TAKERS_LANE_SPREAD` for takers)

    @property
    def idle(self) -> bool:
        """No message of the band's own queue runs."""
        return not self.held

    def size(self) -> int:
        """The pool: the slots the band's own queue keeps from the lane, held or free."""
        load = self.load()
        return math.ceil(load + self.spread * math.sqrt(load))

    def kept(self) -> int:
        """The free slots the lane leaves to the band's own queue now."""
        return max(LANE_KEEPS, self.size() - self.held)


# Smaller starts first: (-priority, enqueue time in milliseconds since the epoch).
Rank = tuple[int, float]
_FIRST = (0, 0)  # the head of a band of one queue whose first item is free


@dataclass(frozen=True)
class ShardMerge(Generic[T]):
    shards: Sequence[int]  # queues per band, hottest band first
    source: Callable[[T], int]  # the index of the queue (shard) an item came from
    rank: Callable[[T], Rank]
    lanes: Sequence[bool] = ()  # per band: its second queue is a noisy lane (default: none)


class BandBuffer(Generic[T]):
    """The messages of one band at hand in a worker, a sequence per queue of the band.

    `lane_every` > 0: the band is fair, its two queues the band's own and the noisy lane,
    and the lane's head goes first once in `lane_every` starts ("Noisy lane")."""

    def __init__(
        self,
        shards: int = 1,
        key: Callable[[T], str | None] = lambda _: None,
        source: Callable[[T], int] = lambda _: 0,
        rank: Callable[[T], Rank] = lambda _: (0, 0.0),
        lane_every: int = 0,
    ) -> None:
        if shards < 1:
            raise ValueError("a band has at least one queue")
        if lane_every and shards != 2:
            raise ValueError("a fair band is its queue and its noisy lane")
        self._lane_every = lane_every
        self._since_lane = 0  # starts from the band's queue since the lane's last
        self._sequences: list[deque[T]] = [deque() for _ in range(shards)]
        self._key = key
        self._source = source if shards > 1 else lambda _: 0
        self._rank = rank
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[T]:
        """Every item, shard by shard, each shard's in its order."""
        for sequence in self._sequences:
            yield from sequence

    def append(self, item: T) -> int:
        """Buffer `item`; the index of the queue (shard, or lane) it came from."""
        source = self._source(item)
        self._sequences[source].append(item)
        self._count += 1
        return source

    @property
    def fair(self) -> bool:
        return bool(self._lane_every)

    def source(self, item: T) -> int:
        """The index of the queue (shard, or lane) `item` came from."""
        return self._source(item)

    def head(self, busy: Container[str]) -> tuple[int, int] | None:
        """Where the item to start next is, (shard, position), or None when no item's key is
        free: the best of the shards' first items whose keys are not `busy`."""
        if len(self._sequences) == 1:
            sequence = self._sequences[0]
            if not sequence:
                return None
            key = self._key(sequence[0])
            if key is None or key not in busy:  # the common case, on the worker's hot path
                return _FIRST
            position = self._first_free(sequence, busy)
            return None if position is None else (0, position)
        if self._lane_every:
            return self._lane_head(busy)
        best: tuple[int, int] | None = None
        best_rank: Rank | None = None
        for shard, sequence in enumerate(self._sequences):
            position = self._first_free(sequence, busy)
            if position is None:
                continue
            rank = self._rank(sequence[position])
            if best_rank is None or rank < best_rank:  # ties: the lower shard
                best, best_rank = (shard, position), rank
        return best

    def _lane_head(self, busy: Container[str]) -> tuple[int, int] | None:
        """The band's queue's first free item, unless it has none or it is the lane's turn."""
        main = self._first_free(self._sequences[0], busy)
        lane = self._first_free(self._sequences[LANE], busy)
        if lane is not None and (main is None or self.lanes_turn):
            return (LANE, lane)
        return None if main is None else (0, main)

    @property
    def lanes_turn(self) -> bool:
        """The lane's guaranteed share is due: its head goes next, if it has one."""
        return self._since_lane + 1 >= self._lane_every

    def at_hand(self, busy: Container[str]) -> list[T]:
        """Every item whose key is not `busy`, shard by shard (for measuring the merge)."""
        return [item for item in self if (key := self._key(item)) is None or key not in busy]

    def pop(self, at: tuple[int, int]) -> T:
        """Take the item at `at` (from `head`) out."""
        shard, position = at
        sequence = self._sequences[shard]
        item = sequence[position]
        del sequence[position]
        self._count -= 1
        if self._lane_every:
            self._since_lane = 0 if shard else self._since_lane + 1
        return item

    def discard(self, drop: Callable[[T], bool]) -> list[T]:
        """Take the items for which `drop` is true out, keeping the others in order."""
        dropped = [item for item in self if drop(item)]
        if dropped:
            for index, sequence in enumerate(self._sequences):
                self._sequences[index] = deque(item for item in sequence if not drop(item))
            self._count -= len(dropped)
        return dropped

    def clear(self) -> None:
        for sequence in self._sequences:
            sequence.clear()
        self._count = 0

    def _first_free(self, sequence: deque[T], busy: Container[str]) -> int | None:
        # The first item of a key is its oldest, so skipping busy keys keeps per-key order.
        for position, item in enumerate(sequence):
            key = self._key(item)
            if key is None or key not in busy:
                return position
        return None


class Policy(Protocol):
    def peek(self, candidates: Sequence[bool]) -> int:
        """The band that would go next among the True ones (at least one), changing nothing."""
        ...

    def commit(self, candidates: Sequence[bool], chosen: int) -> None:
        """Record that `chosen` (the result of `peek(candidates)`) started a message."""
        ...


class StrictPolicy:
    """The hottest band with a message at hand."""

    def peek(self, candidates: Sequence[bool]) -> int:
        return list(candidates).index(True)

    def commit(self, candidates: Sequence[bool], chosen: int) -> None:
        pass

    def pick(self, candidates: Sequence[bool]) -> int:
        return self.peek(candidates)


class WeightedPolicy:
    """Smooth weighted round robin (as in nginx) over the bands that have work at hand.

    Each start adds every candidate band's weight to its credit, starts the band with the most
    credit and takes the total of the candidates' weights from it. Over any run of starts with
    the same candidates, each band's share is its share of the weights, and the starts
    interleave instead of coming in bursts. Bands without work take no part, so an idle band
    neither saves up credit nor blocks the others.
    """

    def __init__(self, weights: Sequence[float]) -> None:
        if not weights or any(weight <= 0 for weight in weights):
            raise ValueError("weights must be positive, one per band")
        self.weights = tuple(float(weight) for weight in weights)
        self._credit = [0.0] * len(self.weights)

    def peek(self, candidates: Sequence[bool]) -> int:
        best = -1
        for index, candidate in enumerate(candidates):
            if candidate and (
                best < 0
                or self._credit[index] + self.weights[index]
                > self._credit[best] + self.weights[best]
            ):
                best = index
        if best < 0:
            raise ValueError("no band is a candidate")
        return best

    def commit(self, candidates: Sequence[bool], chosen: int) -> None:
        total = 0.0
        for index, candidate in enumerate(candidates):
            if candidate:
                self._credit[index] += self.weights[index]
                total += self.weights[index]
        self._credit[chosen] -= total

    def pick(self, candidates: Sequence[bool]) -> int:
        chosen = self.peek(candidates)
        self.commit(candidates, chosen)
        return chosen


def make_policy(name: PolicyName, weights: Sequence[float]) -> Policy:
    if name == "weighted":
        return WeightedPolicy(weights)
    return StrictPolicy()


def default_prefetch(policy: PolicyName, concurrency: int, bands: int) -> tuple[int, ...]:
    """Prefetch per band, hottest first (see the module docstring for why)."""
    full = 2 * concurrency
    if policy == "weighted" or bands == 1:
        # Any band may have to fill every slot to get its share when the others run dry.
        return (full,) * bands
    return (full,) * (bands - 1) + (max(2, concurrency // 4),)


def shard_prefetch(prefetch: int, shards: int) -> int:
    """Prefetch of each shard queue of a band whose prefetch is `prefetch`: split, rounded up.

    A worker consuming all shards then holds about the band's prefetch (`shards` times this
    at most), so the inversion window below still holds with that sum as the band's prefetch.
    """
    return max(1, -(-prefetch // shards))


def inversion_window(concurrency: int, prefetch: Sequence[int], band: int = 0) -> int:
    """`W_i`: colder messages that may start ahead of a newly ready message of band `band`."""
    return min(concurrency, sum(prefetch[band + 1 :]))


class DispatcherClosed(Exception):
    """The dispatcher was closed while waiting for work."""


class Dispatcher(Generic[T]):
    """Per-band buffers and `concurrency` slots; `take()` hands a free slot its next message.

    Pure bookkeeping on one event loop: the AMQP consumers `put()` what arrives, the run loop
    `take()`s, and `done()` frees the slot when the message is settled. With `merge`, each
    band's buffer keeps a sequence per shard and a slot starts the best head among them
    (`BandBuffer`); without, every band's buffer is one sequence in arrival order.

    Refill wait: a band that had a backlog at hand (a delivery found its buffer non-empty)
    and then ran dry is most likely waiting for a refill, not empty on the broker: the broker
    sends the next message only once it has processed an ack, which on a quorum queue means a
    Raft commit, and that was seen to stall for tens of milliseconds on a busy machine. For up
    to `refill_wait` seconds after it ran dry, such a band still counts as a candidate: when
    the policy would pick it, the free slot waits for its next delivery instead of starting
    colder work. A band whose messages arrive one at a time (no backlog) never makes anybody
    wait. When a free slot first waits for such a band (holding colder work back), the band is
    put in `questions`: the owner asks the broker and calls `refill_ended(band)` if the backlog
    really ended, so colder work does not wait out the full `refill_wait` (`RefillProbe`).
    A band that runs dry while nothing colder is at hand costs no question to the broker (the
    coldest band's refills never do).
    """

    def __init__(
        self,
        bands: int,
        policy: Policy,
        concurrency: int,
        key: Callable[[T], str | None] = lambda _: None,
        refill_wait: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        merge: ShardMerge[T] | None = None,
        headroom: Headroom | None = None,
    ) -> None:
        """`headroom`: the coldest band starts a message only while the reserve it asks
        for stays free (`Headroom`)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if merge is not None and len(merge.shards) != bands:
            raise ValueError("merge must give the shards of every band")
        self.concurrency = concurrency
        self.refill_wait = refill_wait
        self._policy = policy
        self._key = key
        self._clock = clock
        self._buffers: list[BandBuffer[T]] = [
            BandBuffer(key=key)
            if merge is None
            else BandBuffer(
                merge.shards[band],
                key,
                merge.source,
                merge.rank,
                LANE_EVERY if band < len(merge.lanes) and merge.lanes[band] else 0,
            )
            for band in range(bands)
        ]
        self._running = 0
        self.headroom = headroom
        self._coldest = bands - 1
        self._hotter_running = 0  # slots held by bands other than the coldest
        self._busy_keys: list[set[str]] = [set() for _ in range(bands)]
        self._backlog = [False] * bands  # a delivery found the buffer non-empty
        self._dry_since: list[float | None] = [None] * bands  # backlog buffer ran dry at
        self._asked = [False] * bands  # in questions in this dry spell
        self._own_arrival = [float("-inf")] * bands  # fair bands: last from the band's queue
        # Fair bands: the slots the band's own queue keeps from the lane.
        self._pools = [QuietPool(clock) if buffer.fair else None for buffer in self._buffers]
        # Bands a free slot waits for the refill of: has the broker any more of them?
        self.questions: asyncio.Queue[int] = asyncio.Queue()
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def running(self) -> int:
        return self._running

    @property
    def closed(self) -> bool:
        return self._closed

    def buffered(self, band: int | None = None) -> int:
        if band is None:
            return sum(len(buffer) for buffer in self._buffers)
        return len(self._buffers[band])

    def put(self, band: int, item: T) -> None:
        buffer = self._buffers[band]
        if buffer:
            self._backlog[band] = True
        if buffer.append(item) == 0 and buffer.fair:
            now = self._clock()
            pool = self._pools[band]
            if pool is not None and pool.idle and now - self._own_arrival[band] >= IDLE_AFTER:
                pool.restart()
            self._own_arrival[band] = now
        self._dry_since[band] = None
        self._changed.set()

    def refill_ended(self, band: int) -> None:
        """The broker holds nothing more for `band` right now: stop waiting for a refill."""
        self._backlog[band] = False
        self._dry_since[band] = None
        self._changed.set()

    def reconsider(self) -> None:
        """What the headroom admits changed outside the dispatcher: waiting takes look again."""
        self._changed.set()

    def takers_waiting(self, count: int) -> None:
        """The slots are takers that come and go (HTTP receives): the messages running and
        `count` takers waiting for one, for the headroom; a fair band's quiet pool keeps the
        takers' margin (`TAKERS_LANE_SPREAD`, "Noisy lane")."""
        for pool in self._pools:
            if pool is not None:
                pool.spread = TAKERS_LANE_SPREAD
        if self.headroom is not None:
            self.headroom.takers_waiting(count)
            self.reconsider()  # a held-back cold message may go now

    def done(self, band: int, item: T) -> None:
        """The slot running `item` (taken from `band`) is free again."""
        self._running -= 1
        self._hotter_running -= int(band < self._coldest)
        if self.headroom is not None:
            self.headroom.ended(hotter=band < self._coldest)
        pool = self._pools[band]
        if pool is not None and self._buffers[band].source(item) != LANE:
            pool.ended()
        key = self._key(item)
        if key is not None:
            self._busy_keys[band].discard(key)
        self._changed.set()

    def waiting_for_refill(self) -> list[int]:
        """Bands a free slot would wait for now (ran dry after a backlog, within the wait)."""
        now = self._clock()
        waiting = []
        for band, dry_since in enumerate(self._dry_since):
            if dry_since is None:
                continue
            if now - dry_since < self.refill_wait:
                waiting.append(band)
            else:
                self._backlog[band] = False  # the backlog ended: stop waiting for it
                self._dry_since[band] = None
        return waiting

    def take_nowait(self, headroom: bool = True) -> tuple[int, T] | None:
        """Claim a slot for the message the policy picks, or None (no slot, nothing at hand,
        or the pick is a band still waiting for its refill); `headroom=False` may take the
        coldest band's message inside the headroom (an HTTP receive filling its batch)."""
        if self._closed or self._running >= self.concurrency:
            return None
        heads = [
            buffer.head(busy) for buffer, busy in zip(self._buffers, self._busy_keys, strict=True)
        ]
        candidates = [head is not None for head in heads]
        if not any(candidates):
            return None
        for band in self.waiting_for_refill():
            candidates[band] = True
        band = self._policy.peek(candidates)
        head = heads[band]
        if self._held_back(band, head, headroom):
            return None
        if head is None:
            # Wait for the refill of a band the policy prefers; ask the owner, once per dry
            # spell, whether one is coming at all.
            if not self._asked[band]:
                self._asked[band] = True
                self.questions.put_nowait(band)
            return None
        self._policy.commit(candidates, band)
        buffer = self._buffers[band]
        item = buffer.pop(head)
        if not buffer and self._backlog[band] and self.refill_wait > 0:
            self._dry_since[band] = self._clock()
            self._asked[band] = False
        self._started(band, lane=head[0] == LANE)
        key = self._key(item)
        if key is not None:
            self._busy_keys[band].add(key)
        return band, item

    def _started(self, band: int, lane: bool) -> None:
        """Count a start of `band` (from its noisy lane with `lane`) in the slots, the
        headroom and the band's quiet pool."""
        self._running += 1
        self._hotter_running += int(band < self._coldest)
        if self.headroom is not None:
            self.headroom.started(hotter=band < self._coldest)
        pool = self._pools[band]
        if pool is not None and not lane:
            pool.started()

    async def take(self) -> tuple[int, T]:
        """Wait for a free slot and a message at hand; `DispatcherClosed` once closed."""
        while True:
            if self._closed:
                raise DispatcherClosed
            taken = self.take_nowait()
            if taken is not None:
                return taken
            self._changed.clear()
            # Wake up when something changes, or when a refill wait runs out. (asyncio.timeout,
            # not wait_for: on Python 3.11 wait_for makes a task each time, and a worker
            # draining a backlog waits here for about every message.)
            deadline = self._next_refill_deadline()
            if deadline is None:
                await self._changed.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline):
                    await self._changed.wait()

    def discard(self, band: int, drop: Callable[[T], bool]) -> list[T]:
        """Take the buffered items of `band` for which `drop` is true out of the buffer."""
        dropped = self._buffers[band].discard(drop)
        if dropped:
            self._changed.set()
        return dropped

    def at_hand(self, band: int) -> list[T]:
        """The buffered items of `band` whose key is not running (for measuring the merge)."""
        return self._buffers[band].at_hand(self._busy_keys[band])

    def close(self) -> list[tuple[int, T]]:
        """Stop handing out messages; return every buffered one (band, item), to give back."""
        self._closed = True
        items = [(band, item) for band, buffer in enumerate(self._buffers) for item in buffer]
        for buffer in self._buffers:
            buffer.clear()
        self._changed.set()
        return items

    def _held_back(self, band: int, head: tuple[int, int] | None, headroom: bool) -> bool:
        """Whether the free slots left are hotter work's headroom (with `headroom`), or the
        slot a fair band's lane leaves to the band's own queue."""
        if (
            band == self._coldest
            and headroom
            and self.headroom is not None
            and not self.headroom.admits(self._running, self._running - self._hotter_running)
        ):
            return True
        return head is not None and head[0] == LANE and self._slot_kept_from_lane(band)

    def _slot_kept_from_lane(self, band: int) -> bool:
        """Whether the free slots left stay free for the fair band's own queue ("Noisy lane"):
        with `LANE_KEEPS_FROM` slots or more, while it had an arrival in the last
        `IDLE_AFTER` seconds, and unless it is the lane's turn. The lane starts only while
        the pool's free slots (`QuietPool.kept`) stay free after it, and the headroom's."""
        headroom = self.headroom if band == self._coldest else None
        slots = self.concurrency if headroom is None else headroom.slots(self._running)
        pool = self._pools[band]
        if (
            pool is None
            or slots < LANE_KEEPS_FROM
            or self._clock() - self._own_arrival[band] >= IDLE_AFTER
            or self._buffers[band].lanes_turn
        ):
            return False
        running = self._running + pool.kept()  # would they stay free after it?
        if headroom is not None:
            cold = running - self._hotter_running
            return not headroom.admits(running, cold, slots)
        return running >= slots

    def _next_refill_deadline(self) -> float | None:
        """Seconds until a refill wait runs out, the headroom's reserve drops to 0, or a fair
        band's queue has been idle long enough to give the lane its last slot.

        Refill waits that ran out end here (`waiting_for_refill`): with every buffer empty,
        `take_nowait` returns before it looks at them, and a wait already over made this 0
        and `take` spin (about 100,000 turns a second) until the next message arrived."""
        self.waiting_for_refill()  # ends the waits that ran out
        ends = [since + self.refill_wait for since in self._dry_since if since is not None]
        if self.headroom is not None and (idle := self.headroom.idle_until()) is not None:
            ends.append(idle)
        now = self._clock()
        ends += [at + IDLE_AFTER for at in self._own_arrival if now < at + IDLE_AFTER]
        if not ends:
            return None
        return max(0.0, min(ends) - self._clock())


def keeps_headroom(
    spec: QueueSpec,
    policy: PolicyName,
    overrides: Container[str],
    prefetch: Sequence[int],
    idle_after: float,
    hot_reserve: int = 0,
) -> bool:
    """Whether the coldest band of `spec` shares the slots through a headroom (see "Headroom"),
    under a consumer's `policy`, prefetch `overrides` (band names) and `prefetch` per band, a
    reserve that follows hotter arrivals for `idle_after` seconds and `hot_reserve` always."""
    coldest = spec.bands[-1]
    return (
        (idle_after > 0 or hot_reserve > 0)
        and policy == "strict"
        and len(spec.bands) > 1
        and coldest.shards == 1
        and not spec.ordered
        and coldest.name not in overrides
        and prefetch[-1] < prefetch[0]
    )


# The key every message of a strictly serial queue has: one runs at a time.
SERIAL_KEY = ""


def shard_merge(spec: QueueSpec) -> ShardMerge[Delivery]:
    """How the dispatcher merges the shards of each band of a queue (`BandBuffer`)."""

    def rank(delivery: Delivery) -> Rank:
        if delivery._rank is None:
            incoming = delivery.incoming
            priority = read_priority(incoming, spec.bands[delivery.band])
            delivery._rank = (-priority, read_enqueued_millis(incoming))
        return delivery._rank

    return ShardMerge(
        shards=tuple(len(spec.band_queues(band)) for band in spec.bands),
        source=lambda delivery: delivery.subscription.shard,
        rank=rank,
        lanes=tuple(band.fair for band in spec.bands),
    )


def dispatch_key(spec: QueueSpec) -> Callable[[Delivery], str | None]:
    """The key the dispatcher runs a queue's deliveries under, one at a time per key."""
    if spec.ordering_required:
        return lambda _: SERIAL_KEY
    return lambda delivery: delivery.key


log = logging.getLogger(__name__)


def plan(
    spec: QueueSpec,
    policy: PolicyName,
    overrides: Container[str],
    prefetch: Sequence[int],
    concurrency: int,
    *,
    refill_wait: float,
    idle_after: float,
    hot_reserve: int = 0,
) -> tuple[tuple[int, ...], Dispatcher[Delivery]]:
    """A consumer's prefetch per band (hottest first) and its dispatcher: the band `policy`,
    per-key order, the shard merge and, where it applies (`keeps_headroom`), the headroom;
    `prefetch` is the consumer's, with its `overrides` (band names)."""
    headroom = None
    if keeps_headroom(spec, policy, overrides, prefetch, idle_after, hot_reserve):
        headroom = Headroom(
            concurrency, idle_after=idle_after, quiet_after=refill_wait, kept=hot_reserve
        )
        # The dispatcher, not the prefetch, keeps the coldest band off hotter work's slots.
        prefetch = (*prefetch[:-1], prefetch[0])
    dispatcher: Dispatcher[Delivery] = Dispatcher(
        len(spec.bands),
        make_policy(policy, spec.weights()),
        concurrency,
        key=dispatch_key(spec),
        refill_wait=refill_wait,
        merge=shard_merge(spec),
        headroom=headroom,
    )
    return tuple(prefetch), dispatcher


class RefillProbe:
    def __init__(
        self,
        bands: Sequence[Sequence[Subscription]],
        dispatcher: Dispatcher[Delivery],
        lifetime: Lifetime,
        refill_wait: float,
        headroom: Headroom | None = None,
    ) -> None:
        self.bands = bands
        self.dispatcher = dispatcher
        self.lifetime = lifetime
        self.refill_wait = refill_wait
        self.headroom = headroom
        self.channel: AbstractChannel | None = None
        # A probe that found a band's backlog goes on answers for the next refill wait too.
        self._backlog_seen_at = [float("-inf")] * len(bands)
        self._probing = [False] * len(bands)

    def start(self, channel: AbstractChannel) -> None:
        """Answer the dispatcher's questions, asking the broker on `channel`."""
        self.channel = channel
        self.lifetime.spawn(self._answer())

    async def _answer(self) -> None:
        while True:
            band = await self.dispatcher.questions.get()
            if self.lifetime.stopping or self._probing[band]:
                continue
            # The broker had more for it a moment ago: its refill is most likely on the way,
            # so ask only once the refill wait since then is over (one question per wait).
            since = asyncio.get_running_loop().time() - self._backlog_seen_at[band]
            self._probing[band] = True
            self.lifetime.spawn(self._probe(band, after=max(0.0, self.refill_wait - since)))

    async def _probe(self, band: int, after: float) -> None:
        try:
            if after:
                await asyncio.sleep(after)
            if not self.lifetime.stopping:
                await self._ask_broker(band)
        finally:
            self._probing[band] = False

    async def _ask_broker(self, band: int) -> None:
        assert self.channel is not None
        ready = 0
        for subscription in self.bands[band]:
            if not subscription.active:
                continue
            try:
                channel = await self.channel.get_underlay_channel()
                declared = await channel.queue_declare(subscription.queue, passive=True)
            except Exception as exc:  # the wait just runs its course
                log.debug("probing %s: %r", subscription.queue, exc)
                return
            ready += declared.message_count or 0
        if ready:
            self._backlog_seen_at[band] = asyncio.get_running_loop().time()
        else:
            self.dispatcher.refill_ended(band)
            if self.headroom is not None and band < len(self.bands) - 1:
                self.headroom.hotter_drained()


__all__ = [
    "IDLE_AFTER",
    "LANE_EVERY",
    "LANE_SPREAD",
    "TAKERS_LANE_SPREAD",
    "POLICIES",
    "SERIAL_KEY",
    "WAIT_CHANCE",
    "BandBuffer",
    "Dispatcher",
    "DispatcherClosed",
    "Headroom",
    "Policy",
    "PolicyName",
    "QuietPool",
    "Rank",
    "RefillProbe",
    "ShardMerge",
    "StrictPolicy",
    "WeightedPolicy",
    "cap",
    "default_prefetch",
    "dispatch_key",
    "floor",
    "inversion_window",
    "keeps_headroom",
    "make_policy",
    "plan",
    "self_wait",
    "shard_merge",
    "shard_prefetch",
]

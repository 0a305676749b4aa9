"""Waterfall dispatch: which band's message a free slot starts next.

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
then oldest (`consumers.merge`).

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
  (`consumers.headroom`): a cold message starts only while cold work holds fewer than
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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Generic, Literal, Protocol, TypeVar, get_args

from bandgate.consumers.headroom import Headroom
from bandgate.consumers.merge import BandBuffer, ShardMerge

PolicyName = Literal["strict", "weighted"]
POLICIES: tuple[str, ...] = get_args(PolicyName)

T = TypeVar("T")


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
    (`consumers.merge`); without, every band's buffer is one sequence in arrival order.

    Refill wait: a band that had a backlog at hand (a delivery found its buffer non-empty)
    and then ran dry is most likely waiting for a refill, not empty on the broker: the broker
    sends the next message only once it has processed an ack, which on a quorum queue means a
    Raft commit, and that was seen to stall for tens of milliseconds on a busy machine. For up
    to `refill_wait` seconds after it ran dry, such a band still counts as a candidate: when
    the policy would pick it, the free slot waits for its next delivery instead of starting
    colder work. A band whose messages arrive one at a time (no backlog) never makes anybody
    wait. When a free slot first waits for such a band (holding colder work back), the band is
    put in `questions`: the owner asks the broker and calls `settle(band)` if the backlog
    really ended, so colder work does not wait out the full `refill_wait` (`consumers.probe`).
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
        for stays free (`consumers.headroom`)."""
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
            else BandBuffer(merge.shards[band], key, merge.source, merge.rank)
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
        buffer.append(item)
        self._dry_since[band] = None
        self._changed.set()

    def settle(self, band: int) -> None:
        """The broker holds nothing more for `band` right now: stop waiting for a refill."""
        self._backlog[band] = False
        self._dry_since[band] = None
        self._changed.set()

    def reconsider(self) -> None:
        """What the headroom admits changed outside the dispatcher: waiting takes look again."""
        self._changed.set()

    def done(self, band: int, item: T) -> None:
        """The slot running `item` (taken from `band`) is free again."""
        self._running -= 1
        self._hotter_running -= int(band < self._coldest)
        if self.headroom is not None:
            self.headroom.ended(hotter=band < self._coldest)
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
        if (
            band == self._coldest
            and headroom
            and self.headroom is not None
            and not self.headroom.admits(self._running, self._running - self._hotter_running)
        ):
            return None  # the free slots left are hotter work's headroom
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
        self._running += 1
        self._hotter_running += int(band < self._coldest)
        if self.headroom is not None:
            self.headroom.started(hotter=band < self._coldest)
        key = self._key(item)
        if key is not None:
            self._busy_keys[band].add(key)
        return band, item

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

    def _next_refill_deadline(self) -> float | None:
        """Seconds until a refill wait runs out or the headroom's reserve drops to 0."""
        ends = [since + self.refill_wait for since in self._dry_since if since is not None]
        if self.headroom is not None and (idle := self.headroom.idle_until()) is not None:
            ends.append(idle)
        if not ends:
            return None
        return max(0.0, min(ends) - self._clock())

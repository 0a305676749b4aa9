"""One queue consumed over HTTP: the worker library's consumer, with a handler that parks.

An HTTP receiver is a `ConsumerRunner` driven through its public interface
(`bandgate.consumers.runner`) instead of its run loop: the same scheduling (waterfall, partition
keys, shard merge) and pipeline (delivery limit, retries, dead-letters, metrics, traces). What
differs:

- a waiting `receive` `take`s from the runner (a slot is a lease: `BANDGATE_PULL_MAX_LEASES`
  per queue and process) and `start`s the message's pipeline, as the run loop would;
- the handler (`_park`) opens a lease, hands it to that `receive`, and waits for how it ends:
  an ack returns, a release raises `Retry` (a failed attempt: back-off, then the dead-letter
  queue after `max_attempts`) or `Reject` (dead-letter now), a lapse raises `Requeue` (back
  in its queue at once, counted as a delivery, so `max_deliveries` applies); the runner's
  hooks (`Settlements`) tell the client's request what its message came to;
- the headroom's slots (`bandgate.consumers.scheduling`, Headroom) are the open leases and the
  receives waiting for a first message (`ConsumerRunner.takers_waiting`): a cold first message
  leaves enough receives waiting for hotter ones, as a worker keeps free slots (a batch then
  takes what is at hand, cold or not);
- while no client waits, the receiver pauses after `linger_seconds`: it stops consuming, so
  new messages go to gateway processes whose clients wait. On RabbitMQ 4.3 it also gives back
  what it holds unleased (a nack, which 4.3 does not count as a delivery). Earlier versions
  count every return (a client that polls, then sleeps, would see its messages dead-lettered
  for `delivery-limit`): there the held messages stay for the next `receive` here, for
  `hold_seconds`; then they go back as uncounted copies (`Settler.hand_back`), at the back of
  their band, so that no process keeps messages that no client asked for. A
  `receive` resumes it, hottest band first, each band's first prefetch in hand before the
  next (as a worker starts), so a backlog's order is strict from the first `receive` on.
  Ordered queues (single active consumer) never pause.

On an ordered queue a release is retried in place (`bandgate.consumers.decision`): after the
back-off the pipeline runs the handler again, which offers the message to the next `receive`
before anything else (a "rerun"). A key is never handed out while one of its messages is leased
or re-run.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace

from aio_pika.abc import AbstractConnection

from bandgate.consumers import (
    Consumer,
    ConsumerOptions,
    ConsumerRunner,
    Delivery,
    Message,
    Outcome,
    Reject,
    Requeue,
    Retry,
    Settler,
    Timings,
    Tombstones,
    keeps_headroom,
)
from bandgate.core.telemetry import Telemetry
from bandgate.pull.leases import (
    Lapsed,
    Lease,
    LeaseBook,
    LeaseEnd,
    LeaseGone,
    Released,
    Settlements,
)
from bandgate.pull.settings import PullSettings
from bandgate.topology.model import QueueSpec

log = logging.getLogger(__name__)


@dataclass
class _Handoff:
    """What a `receive` tells the handler it starts: the lease's terms, and where to put it
    (None there: the pipeline ended without reaching the handler)."""

    visibility: float
    owner: str
    delivery: Delivery
    leased: asyncio.Future[Lease | None]
    task: asyncio.Task[Outcome | None] | None = None

    def pipeline_ended(self, _: asyncio.Task[Outcome | None]) -> None:
        if not self.leased.done():
            self.leased.set_result(None)  # settled without a lease: dead-lettered, say
        # The task's context holds this handoff: a reference back to the task would make a
        # message's objects cyclic garbage, for the collector (`bandgate.pull.routes._hang_up`).
        self.task = None


@dataclass
class _Rerun:
    """An ordered queue's message to lease again, after a release and its back-off."""

    message: Message
    delivery: Delivery
    task: asyncio.Task[Outcome | None] | None
    leased: asyncio.Future[Lease]


# Set around starting a message's pipeline task, whose context copies it for the handler.
_HANDOFF: contextvars.ContextVar[_Handoff] = contextvars.ContextVar("bandgate_pull_handoff")


class PullQueue:
    def __init__(
        self,
        spec: QueueSpec,
        connection: AbstractConnection,
        settler: Settler,
        book: LeaseBook,
        settings: PullSettings,
        telemetry: Telemetry | None,
        count_returns: bool = True,
        tombstones: Tombstones | None = None,
        leases: int | None = None,
    ) -> None:
        """`count_returns`: every return counts as a delivery (before 4.3); `tombstones`;
        `leases`: each band's prefetch and the queue's slots (`PullSettings.queue_leases`;
        default `max_leases`)."""
        self.spec = spec
        self.count_returns = count_returns
        self.book = book
        self.settings = settings
        self.settlements = Settlements()
        self._leased = telemetry.series(telemetry.leased, spec.name) if telemetry else None
        leases = leases or settings.max_leases
        self.leases = leases
        # Every band may lease every slot; the coldest shares them through the headroom (`_seats`).
        coldest = spec.bands[-1].name
        options = ConsumerOptions(
            queue=spec.name,
            concurrency=leases,
            retry=spec.retry,
            prefetch_overrides={band.name: leases for band in spec.bands if band.name != coldest},
            hot_reserve=min(settings.hot_reserve, leases - 1),
        )
        boost = settings.cold_boost_seconds
        overrides = options.prefetch_overrides
        prefetch = options.prefetch(spec)
        reserve = options.hot_reserve
        if not keeps_headroom(spec, options.policy, overrides, prefetch, boost, reserve):
            every = {band.name: leases for band in spec.bands}
            options = replace(options, prefetch_overrides=every)
        self._empty: set[object] = set()  # receives waiting with no message yet
        self.runner = ConsumerRunner(
            Consumer(self._park, spec, options),
            connection,
            settler,
            concurrency=leases,
            timings=Timings(headroom_after=boost),
            telemetry=telemetry,
            tombstones=tombstones,
            hooks=self.settlements,
            hand_back=count_returns,
        )
        self.runner.takers_waiting(0)  # the headroom's slots: leases and waiting receives
        self._waiting = 0
        self._paused = False
        self._switch = asyncio.Lock()
        self._pause_timer: asyncio.TimerHandle | None = None
        self._hold_timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._reruns: collections.deque[_Rerun] = collections.deque()
        self._rerun_ready = asyncio.Event()

    async def open(self) -> None:
        await self.runner.open()
        self._idle()

    async def receive(
        self,
        count: int,
        wait: float,
        visibility: float,
        owner: str,
        allowance: Callable[[], int],
    ) -> list[Lease]:
        """Lease up to `count` messages, hottest first, waiting up to `wait` s for the first;
        stop early once the payloads reach the response budget or `allowance()` (leases the
        owner may still open) is used up."""
        self._waiting += 1
        seat = object()
        self._seat(seat, empty=True)  # a seat more: a held-back cold lease may go
        self._cancel_timers()
        leases: list[Lease] = []
        try:
            await self._resume()
            deadline = asyncio.get_running_loop().time() + wait
            return await self._fill(seat, leases, count, deadline, visibility, owner, allowance)
        except asyncio.CancelledError:
            for lease in leases:
                self._unseen(lease)  # nobody will see its receipt
            raise
        finally:
            self._seat(seat, empty=False)
            self._waiting -= 1
            if not self._waiting:
                self._idle()

    def _seat(self, seat: object, *, empty: bool) -> None:
        """Whether a receive's `seat` waits for a first message: the headroom's slots are
        the open leases and these."""
        if empty:
            self._empty.add(seat)
        else:
            self._empty.discard(seat)
        self.runner.takers_waiting(len(self._empty))

    async def _fill(
        self,
        seat: object,
        leases: list[Lease],
        count: int,
        deadline: float,
        visibility: float,
        owner: str,
        allowance: Callable[[], int],
    ) -> list[Lease]:
        runner = self.runner
        size = 0
        while len(leases) < count and size < self.settings.max_response_bytes and allowance() > 0:
            if self._reruns:
                rerun = self._reruns.popleft()
                lease = self._open(rerun.message, rerun.delivery, rerun.task, visibility, owner)
                rerun.leased.set_result(lease)
                leases.append(lease)
                self._seat(seat, empty=False)
                size += len(rerun.delivery.body)
                continue
            if leases:
                # A batch returns at once: what it takes keeps no receive waiting, headroom or not.
                taken = runner.take_nowait()
                if taken is None:
                    break  # what is at hand now is all this response gets
            else:
                try:
                    taken = await self._take(deadline)
                except TimeoutError:
                    break
                if taken is None:
                    continue  # a rerun is ready
                self._seat(seat, empty=False)  # counted as a lease from now on
            leased = await self._lease(*taken, visibility, owner)
            if leased is None and not leases:
                self._seat(seat, empty=True)  # settled without a lease: still waiting for one
            if leased is not None:
                leases.append(leased)
                size += len(taken[1].body)
        return leases

    async def _take(self, deadline: float) -> tuple[int, Delivery] | None:
        """The runner's next message by `deadline` (loop time), else `TimeoutError`; None
        when a rerun became ready first."""
        runner = self.runner
        if not self.spec.ordered:
            async with asyncio.timeout_at(deadline):
                return await runner.take()  # claims nothing unless it returns
        self._rerun_ready.clear()
        taking = asyncio.ensure_future(runner.take())
        rerun = asyncio.ensure_future(self._rerun_ready.wait())
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            await asyncio.wait((taking, rerun), timeout=remaining, return_when="FIRST_COMPLETED")
        except BaseException:
            if taking.done() and not taking.cancelled() and taking.exception() is None:
                await runner.untake(*taking.result())  # taken as this receive was cancelled
            raise
        finally:
            for waiter in (taking, rerun):
                waiter.cancel()
            await asyncio.gather(taking, rerun, return_exceptions=True)
        if not taking.cancelled():
            return taking.result()
        if self._reruns:
            return None
        raise TimeoutError

    async def _lease(
        self, band: int, delivery: Delivery, visibility: float, owner: str
    ) -> Lease | None:
        """Start the message's pipeline; its lease, or None when it was settled without
        reaching the handler (dead-lettered: delivered too often, or malformed)."""
        handoff = _Handoff(visibility, owner, delivery, asyncio.get_running_loop().create_future())
        token = _HANDOFF.set(handoff)
        try:
            task = self.runner.start(band, delivery)
        finally:
            _HANDOFF.reset(token)
        if task is None:
            return None
        handoff.task = task
        task.add_done_callback(handoff.pipeline_ended)
        try:
            # Awaited directly (no `asyncio.wait` beside it): cancelled, this receive cancels
            # the future too, and a handler that finds it so gives the message back (`_park`).
            return await handoff.leased
        except asyncio.CancelledError:
            task.cancel()  # its message goes back to its band, uncounted
            raise

    def _unseen(self, lease: Lease) -> None:
        """Nobody will see this lease's receipt: give its message back now, uncounted."""
        if lease.delivery is not None:
            self.settlements.awaited.pop(lease.delivery, None)
        if lease.task is not None:
            lease.task.cancel()

    async def _park(self, message: Message) -> None:
        """The handler: lease the message, wait for how it ends, and say it the library's way."""
        handoff = _HANDOFF.get()
        if handoff.leased.cancelled():
            raise asyncio.CancelledError  # its receive was cancelled: back to its band, uncounted
        if handoff.leased.done():
            # Run again in place (ordered queue): wait for the next receive to lease it.
            future = asyncio.get_running_loop().create_future()
            self._reruns.append(_Rerun(message, handoff.delivery, handoff.task, future))
            self._rerun_ready.set()
            lease = await future
        else:
            lease = self._open(
                message, handoff.delivery, handoff.task, handoff.visibility, handoff.owner
            )
            handoff.leased.set_result(lease)
        try:
            how = await lease.ended
        finally:
            self.book.close(lease)
            if self._leased is not None:
                self._leased.dec()
        if isinstance(how, Lapsed):
            raise Requeue("visibility timeout lapsed")
        if isinstance(how, Released):
            if how.dead_letter:
                raise Reject(how.reason or "dead-lettered by the HTTP client")
            raise Retry(how.delay, how.reason or "released by the HTTP client")

    def _open(
        self,
        message: Message,
        delivery: Delivery,
        task: asyncio.Task[Outcome | None] | None,
        visibility: float,
        owner: str,
    ) -> Lease:
        lease = self.book.open(self.spec.name, message, visibility, owner)
        if self._leased is not None:
            self._leased.inc()
        lease.delivery = delivery
        if task is not None:
            lease.settled_by(task)
        self.settlements.awaited[delivery] = lease.outcome
        return lease

    def end(self, lease: Lease, how: LeaseEnd) -> asyncio.Future[Outcome | None]:
        """End a lease: its outcome once its message is settled on the broker (None: the
        pipeline ended without settling it, and it went back to its band). Waiting for it
        cancels nothing: a client that hangs up does not stop the settlement half-way."""
        if lease.delivery is not None and lease.delivery.channel_gone:
            lease.end(Lapsed())
            raise LeaseGone(lease.receipt)  # the broker took it back with its channel
        if not lease.end(how):
            raise LeaseGone(lease.receipt)
        return lease.outcome

    def _idle(self) -> None:
        """Pause after `linger_seconds` unless a client comes back meanwhile."""
        if self.spec.ordered or self._pause_timer is not None:
            return
        self._pause_timer = asyncio.get_running_loop().call_later(
            self.settings.linger_seconds, self._spawn_pause
        )

    def _cancel_timers(self) -> None:
        for timer in (self._pause_timer, self._hold_timer):
            if timer is not None:
                timer.cancel()
        self._pause_timer = self._hold_timer = None

    def _spawn_pause(self) -> None:
        self._pause_timer = None
        self._spawn(self._pause())

    def _spawn_release(self) -> None:
        self._hold_timer = None
        self._spawn(self._release_held())

    def _spawn(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _pause(self) -> None:
        async with self._switch:
            if self._waiting or self._paused or self.runner.stopping:
                return
            # Before 4.3, what it holds waits here for the next receive: see the docstring.
            await self.runner.pause(give_back_held=not self.count_returns)
            self._paused = True
            if self.count_returns:
                self._hold_timer = asyncio.get_running_loop().call_later(
                    self.settings.hold_seconds, self._spawn_release
                )

    async def _release_held(self) -> None:
        """Past `hold_seconds` paused: give back what it holds, as uncounted copies."""
        async with self._switch:
            if self._waiting or not self._paused or self.runner.stopping:
                return
            await self.runner.pause(give_back_held=True)

    async def _resume(self) -> None:
        """Consume again, hottest band first, each primed (`ConsumerRunner.open`'s reasons)."""
        if not self._paused and not self._switch.locked():
            return  # consuming, no pause under way: every receive of a busy queue is here
        async with self._switch:  # after a pause under way, if one is
            if not self._paused:
                return
            await self.runner.resume()
            self._paused = False

    async def close(self) -> None:
        """Stop taking; the messages still leased go back to their bands, uncounted."""
        self._cancel_timers()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.runner.stop_consuming()
        await self.runner.abort()
        await self.runner.close()


__all__ = ["PullQueue"]

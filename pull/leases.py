"""Leases: a message handed to an HTTP client, invisible to others until it is settled or lapses.

A lease is the parked handler's side of a message (`bandgate.pull.receiver`): the handler waits
for how it `ended`, which the client's ack or release decides (an extend moves its timer), or
its visibility timer when that runs out first. The book keeps this process's leases by number
and counts them per token (`BANDGATE_PULL_MAX_LEASES_PER_TOKEN`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from bandgate.consumers import Delivery, Message, Outcome
from bandgate.pull.receipts import Receipt, ReceiptError, Signer


@dataclass(frozen=True)
class Acked:
    """The client handled it."""


@dataclass(frozen=True)
class Released:
    """The client gives it back: a failed attempt (retried after `delay`, or the queue's
    back-off), or straight to the dead-letter queue (`dead_letter`)."""

    delay: float | None = None
    reason: str | None = None
    dead_letter: bool = False


@dataclass(frozen=True)
class Lapsed:
    """Its visibility timeout ran out: visible again, one more receive counted."""


LeaseEnd = Acked | Released | Lapsed


class LeaseGone(Exception):
    """No such lease here any more: it lapsed, was settled, or its process restarted."""


class Lease:
    __slots__ = (
        "number",
        "receipt",
        "queue",
        "message",
        "owner",
        "ended",
        "task",
        "outcome",
        "delivery",
        "visible_until",
        "_timer",
    )

    def __init__(self, number: int, receipt: str, queue: str, message: Message, owner: str):
        self.number = number
        self.receipt = receipt
        self.queue = queue
        self.message = message
        self.owner = owner  # the token's name, for its lease count
        self.ended: asyncio.Future[LeaseEnd] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[Outcome | None] | None = None  # the pipeline settling it
        self.delivery: Delivery | None = None  # what the broker delivered
        # What the runner made of how it ended, once settled on the broker; None when its
        # pipeline ended without settling it (it went back to its band).
        self.outcome: asyncio.Future[Outcome | None] = asyncio.get_running_loop().create_future()
        self._timer: asyncio.TimerHandle | None = None
        self.visible_until: datetime  # set by `hide_for`, which `LeaseBook.open` calls

    def settled_by(self, task: asyncio.Task[Outcome | None]) -> None:
        """`task` is the pipeline that settles it: if it ends first, the outcome is None. A
        callback, not a wait beside the outcome's: one less future and task wake-up per ack."""
        self.task = task
        task.add_done_callback(self._pipeline_ended)

    def _pipeline_ended(self, _: asyncio.Task[Outcome | None]) -> None:
        if not self.outcome.done():
            self.outcome.set_result(None)
        self.task = None  # its context leads back here: no cycle once it is done

    def hide_for(self, seconds: float) -> None:
        """Invisible for `seconds` from now (0: lapses at once)."""
        if self._timer is not None:
            self._timer.cancel()
        self.visible_until = datetime.fromtimestamp(time.time() + seconds, UTC)
        self._timer = asyncio.get_running_loop().call_later(seconds, self.end, Lapsed())

    def end(self, how: LeaseEnd) -> bool:
        """End the lease; False when it had ended already."""
        if self.ended.done():
            return False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None  # its callback is this lease's method: no cycle left behind
        self.ended.set_result(how)
        return True


class LeaseBook:
    def __init__(self, signer: Signer) -> None:
        self.signer = signer
        self._leases: dict[int, Lease] = {}
        self._per_owner: Counter[str] = Counter()
        self._next = 0

    def open(self, queue: str, message: Message, visibility: float, owner: str) -> Lease:
        self._next += 1
        number = self._next
        lease = Lease(number, self.signer.issue(number, queue), queue, message, owner)
        lease.hide_for(visibility)
        self._leases[number] = lease
        self._per_owner[owner] += 1
        return lease

    def close(self, lease: Lease) -> None:
        if self._leases.pop(lease.number, None) is not None:
            self._per_owner[lease.owner] -= 1
            if not self._per_owner[lease.owner]:
                del self._per_owner[lease.owner]

    def find(self, receipt: Receipt, queue: str) -> Lease:
        """The open lease of `receipt`; `ReceiptError` when this process did not issue it for
        `queue`, `LeaseGone` when it is no longer held."""
        self.signer.verify(receipt, queue)
        lease = self._leases.get(receipt.lease)
        if lease is None or lease.ended.done():
            raise LeaseGone(receipt.text)
        return lease

    def held(self, owner: str) -> int:
        return self._per_owner[owner]

    def __len__(self) -> int:
        return len(self._leases)


class Settlements:
    """The runner's hooks (`bandgate.consumers.RunnerHooks`): they tell a client that ended a
    lease what its message came to.

    The runner reports each handler run's outcome once it is settled (its retry or dead-letter
    copy confirmed); on an ordered queue a retry in place is reported before its back-off, while
    the runner goes on holding the message (and leases it again)."""

    def __init__(self) -> None:
        self.awaited: dict[Delivery, asyncio.Future[Outcome | None]] = {}  # the leased ones

    def settled(self, delivery: Delivery, message: Message, outcome: Outcome) -> None:
        waiting = self.awaited.pop(delivery, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(outcome)


__all__ = [
    "Acked",
    "Lapsed",
    "Lease",
    "LeaseBook",
    "LeaseEnd",
    "LeaseGone",
    "ReceiptError",
    "Released",
    "Settlements",
]

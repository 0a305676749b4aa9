"""The HTTP receivers of one gateway process: receive, and settle by receipt, here or forwarded.

One `Receivers` per process holds its replica id, its receipt signer and lease book, one
`PullQueue` per queue a client has received from (made at the first receive: a gateway that
only publishes never consumes), and its mailbox (`bandgate.pull.mailbox`). Settling a receipt
issued here decides the lease; a receipt of another process is forwarded to it. Errors are
`ApiError`s, which travel back through a forward unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import aiormq
from aio_pika.abc import AbstractConnection
from aio_pika.exceptions import ChannelInvalidStateError

from bandgate.consumers import Ack, DeadLetter, GiveBack, Outcome, RetryLater, Settler, Tombstones
from bandgate.core import error_codes
from bandgate.core.broker import BrokerLink
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.core.telemetry import Telemetry
from bandgate.gateway.budgets import Seats
from bandgate.gateway.errors import ApiError
from bandgate.pull.leases import Acked, Lease, LeaseBook, LeaseEnd, LeaseGone, Released
from bandgate.pull.mailbox import Answer, Command, HolderGone, Mailbox
from bandgate.pull.receipts import Receipt, ReceiptError, Signer, new_replica_id, parse
from bandgate.pull.receiver import PullQueue
from bandgate.pull.settings import PullSettings
from bandgate.topology import wire
from bandgate.topology.declare import counts_every_return
from bandgate.topology.model import QueueSpec

log = logging.getLogger(__name__)


def lease_gone() -> ApiError:
    return ApiError.of(
        error_codes.LEASE_EXPIRED,
        "no lease holds this receipt any more: its visibility timeout lapsed (the message is "
        "visible again), it was settled already, or the gateway process restarted",
        "receipt",
    )


def invalid_receipt(exc: ReceiptError) -> ApiError:
    return ApiError.of(error_codes.INVALID_RECEIPT, str(exc), "receipt")


def outcome_body(outcome: Outcome | None) -> dict[str, Any]:
    """What became of a settled message, for the client."""
    if isinstance(outcome, Ack):
        return {"outcome": "acked"}
    if isinstance(outcome, RetryLater):
        return {"outcome": "retry", "attempt": outcome.attempt, "retry_in_seconds": outcome.delay}
    if isinstance(outcome, DeadLetter):
        return {"outcome": "dead-lettered", "cause": outcome.cause, "reason": outcome.reason}
    if isinstance(outcome, GiveBack):
        # A lapse, or a retry or dead-letter copy the broker did not confirm: back in its band.
        return {"outcome": "requeued", "reason": outcome.reason}
    # The pipeline ended without settling it (the gateway stops): back in its band.
    return {"outcome": "returned"}


class Receivers:
    def __init__(
        self,
        link: BrokerLink,
        settings: PullSettings,
        telemetry: Telemetry | None,
        max_connections: int,
        max_message_bytes: int,
        replica: str | None = None,
    ) -> None:
        """`max_connections`: the process's (`PullSettings.receive_seats`);
        `max_message_bytes`: the largest message body it accepts (`PullSettings.queue_leases`)."""
        self.max_message_bytes = max_message_bytes
        self.link = link
        self.settings = settings
        self.telemetry = telemetry
        per_token, total = settings.receive_seats(max_connections)
        self.seats = Seats(per_token, total, error_codes.TOO_MANY_RECEIVES, "receives")
        self.replica = replica or new_replica_id()
        self.book = LeaseBook(Signer(self.replica))
        self._settler = Settler(link.publisher)
        self._queues: dict[str, PullQueue] = {}
        self._mailbox: Mailbox | None = None
        self.ledger: LedgerFollower | None = None  # from the first receive on
        self._opening = asyncio.Lock()

    def _connection(self) -> AbstractConnection:
        connection = self.link.connection
        if connection is None or not self.link.connected:
            raise ApiError.of(
                error_codes.BROKER_UNAVAILABLE, self.link.problem or "not connected to the broker"
            )
        return connection

    async def _ready_mailbox(self) -> Mailbox:
        if self._mailbox is None:
            async with self._opening:
                if self._mailbox is None:
                    mailbox = Mailbox(
                        self._connection(),
                        self.link.topology.exchange,
                        self.replica,
                        self._carry_out,
                        self.settings.forward_timeout_seconds,
                    )
                    await mailbox.open()
                    self._mailbox = mailbox
        return self._mailbox

    async def _ready_ledger(self) -> LedgerFollower:
        """Follow the tombstone ledger from the first receive on; one that cannot be read
        is logged, shown by /readyz and the metrics, and skips nothing."""
        if self.ledger is None:
            async with self._opening:
                if self.ledger is None:
                    follower = LedgerFollower(
                        self._connection(), self.link.topology, self.link.publisher, self.telemetry
                    )
                    await follower.start(self.settings.ledger_catchup_seconds)
                    self.ledger = follower
        return self.ledger

    async def _queue(self, spec: QueueSpec) -> PullQueue:
        await self._ready_mailbox()  # receipts must be answerable before one is issued
        ledger = await self._ready_ledger()
        queue = self._queues.get(spec.name)
        if queue is None:
            async with self._opening:
                queue = self._queues.get(spec.name)
                if queue is None:
                    queue = PullQueue(
                        spec,
                        self._connection(),
                        self._settler,
                        self.book,
                        self.settings,
                        self.telemetry,
                        count_returns=counts_every_return(self.link.version),
                        tombstones=Tombstones(ledger),
                        leases=self._leases(spec),
                    )
                    await queue.open()
                    self._queues[spec.name] = queue
        return queue

    async def receive(
        self, spec: QueueSpec, count: int, wait: float, visibility: float, owner: str
    ) -> list[Lease]:
        """Lease up to `count` messages for `owner`, waiting up to `wait` s for the first, in
        one of the token's seats (`PullSettings.receive_seats`)."""
        with self.seats.taken(owner):
            if self.telemetry is not None:
                self.telemetry.receives_open.set(len(self.seats))
            try:
                return await self._receive(spec, count, wait, visibility, owner)
            finally:
                if self.telemetry is not None:
                    self.telemetry.receives_open.set(len(self.seats) - 1)

    async def _receive(
        self, spec: QueueSpec, count: int, wait: float, visibility: float, owner: str
    ) -> list[Lease]:
        allowed = self.settings.token_leases(self._leases(spec))
        if self.book.held(owner) >= allowed:
            raise ApiError.of(
                error_codes.TOO_MANY_LEASES,
                f"this token holds {allowed} leases in this gateway process, its limit: "
                "settle some first",
                headers={"Retry-After": "1"},
            )
        try:
            self._connection()  # a receiver made earlier would wait for the broker instead
            queue = await self._queue(spec)
            return await queue.receive(
                count, wait, visibility, owner, lambda: allowed - self.book.held(owner)
            )
        except (
            aiormq.exceptions.AMQPError,
            ConnectionError,
            ChannelInvalidStateError,
            TimeoutError,  # its channel did not reopen after a reconnection
        ) as exc:
            # The broker went away while this receive subscribed or resumed; what it had
            # leased went back with the channel.
            raise ApiError.of(
                error_codes.BROKER_UNAVAILABLE, f"the broker is unavailable: {exc!r}"
            ) from None

    def _leases(self, spec: QueueSpec) -> int:
        return self.settings.queue_leases(len(spec.bands), self.max_message_bytes)

    async def ack(self, queue: str, receipt: str) -> dict[str, Any]:
        return await self._on_receipt(queue, receipt, {"op": "ack"})

    async def ack_all(self, queue: str, receipts: list[str]) -> list[ApiError | None]:
        """Ack each of `receipts`: None for each acked, or the error its own ack would answer.

        The leases held here all end at once and their settlements are awaited together, so
        their acks go out in one write (joined into `multiple` acks where the delivery tags
        allow, `bandgate.core.protocol.acks`), not one loop turn and one wait after another;
        the receipts of other processes are forwarded all at once."""
        results: list[ApiError | None] = [None] * len(receipts)
        settling: list[asyncio.Future[Outcome | None]] = []
        forwarded: dict[int, Awaitable[dict[str, Any]]] = {}
        for index, text in enumerate(receipts):
            try:
                receipt = parse(text)
                if receipt.replica != self.replica:
                    forwarded[index] = self._on_receipt(queue, text, {"op": "ack"})
                    continue
                settling.append(self._end(queue, receipt, Acked()))
            except ReceiptError as exc:
                results[index] = invalid_receipt(exc)
            except ApiError as exc:
                results[index] = exc
        answers = await asyncio.gather(*forwarded.values(), return_exceptions=True)
        for index, answer in zip(forwarded, answers, strict=True):
            if isinstance(answer, ApiError):
                results[index] = answer
            elif isinstance(answer, BaseException):
                raise answer
        if settling:
            await asyncio.wait(settling)
        return results

    async def release(
        self, queue: str, receipt: str, delay: float | None, reason: str | None, dead_letter: bool
    ) -> dict[str, Any]:
        command = {"op": "release", "delay": delay, "reason": reason, "dead_letter": dead_letter}
        return await self._on_receipt(queue, receipt, command)

    async def extend(self, queue: str, receipt: str, visibility: float) -> dict[str, Any]:
        return await self._on_receipt(queue, receipt, {"op": "extend", "visibility": visibility})

    async def _on_receipt(self, queue: str, text: str, command: Command) -> dict[str, Any]:
        """Carry out a client's command (ack, release, extend) on the lease `text` names: here,
        or forwarded to the process holding it."""
        try:
            receipt = parse(text)
        except ReceiptError as exc:
            raise invalid_receipt(exc) from None
        if receipt.replica == self.replica:
            return await self._apply(queue, receipt, command)
        mailbox = await self._ready_mailbox()
        try:
            answer = await mailbox.forward(
                receipt.replica, {**command, "queue": queue, "receipt": text}
            )
        except HolderGone:
            raise ApiError.of(
                error_codes.LEASE_LOST,
                "the gateway process that leased this message is gone; the broker gave the "
                "message back to its queue, and it will be received again",
                "receipt",
            ) from None
        except TimeoutError:
            raise ApiError.of(
                error_codes.HOLDER_UNRESPONSIVE,
                "the gateway process holding this lease did not answer in time; try again",
                headers={"Retry-After": "1"},
            ) from None
        if answer["status"] != 200:
            error = answer["error"]
            raise ApiError(answer["status"], error["code"], error["message"], error.get("field"))
        body: dict[str, Any] = answer["body"]
        return body

    async def _apply(self, queue: str, receipt: Receipt, command: Command) -> dict[str, Any]:
        if command["op"] == "extend":
            lease = self._find(receipt, queue)
            lease.hide_for(float(command["visibility"]))
            return {"receipt": receipt.text, "visible_until": iso(lease.visible_until)}
        how: LeaseEnd = (
            Acked()
            if command["op"] == "ack"
            else Released(command.get("delay"), command.get("reason"), command["dead_letter"])
        )
        settled = self._end(queue, receipt, how)
        await asyncio.wait((settled,))  # not cancelled with the request: see `PullQueue.end`
        return {"receipt": receipt.text, **outcome_body(settled.result())}

    def _find(self, receipt: Receipt, queue: str) -> Lease:
        try:
            return self.book.find(receipt, queue)
        except ReceiptError as exc:
            raise invalid_receipt(exc) from None
        except LeaseGone:
            raise lease_gone() from None

    def _end(self, queue: str, receipt: Receipt, how: LeaseEnd) -> asyncio.Future[Outcome | None]:
        """End the lease of a receipt issued here (`PullQueue.end`)."""
        lease = self._find(receipt, queue)
        owner = self._queues.get(queue)
        assert owner is not None, "a lease of a queue never received from"
        try:
            return owner.end(lease, how)
        except LeaseGone:
            raise lease_gone() from None

    async def _carry_out(self, command: Command) -> Answer:
        """A settlement forwarded here by another process."""
        try:
            receipt = parse(str(command.get("receipt")))
            body = await self._apply(str(command.get("queue")), receipt, command)
        except ReceiptError as exc:
            return {"status": 422, "error": invalid_receipt(exc).body()}
        except ApiError as exc:
            return {"status": exc.status, "error": exc.body()}
        except Exception:
            log.exception("a forwarded settlement failed")
            return {"status": 503, "error": {"code": "internal_error", "message": "see logs"}}
        return {"status": 200, "body": body}

    async def close(self) -> None:
        """Give every leased message back (uncounted), then close the mailbox."""
        for queue in self._queues.values():
            await queue.close()
        if self._mailbox is not None:
            await self._mailbox.close()
        if self.ledger is not None:
            await self.ledger.close()


iso = wire.moment_text  # the API's one form of a moment


__all__ = ["Receivers", "iso", "outcome_body"]

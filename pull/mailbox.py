"""Forwarding a settlement to the gateway process that holds the lease, through the broker.

Behind a round-robin load balancer, an ack, release or extend often reaches a process other
than the one that leased the message. A lease is an unacked delivery on that process's
channel, and only that channel can settle it, so the request is forwarded there:

- every process serving HTTP receivers has a mailbox, an exclusive queue named after its
  replica id (`naming.replica_mailbox`), on its broker connection;
- another process publishes the command to it (default exchange, mandatory, confirmed) and
  waits for the answer in its own mailbox (`forward_timeout_seconds`, then 503);
- when the holder is gone (killed, or its connection lost), the broker has already deleted its
  mailbox and returned its leases to their queues. The command comes back unroutable, and the
  client gets 410 `lease_lost`.

Why the broker and not HTTP between replicas: the processes need no addresses of each other
(no service discovery, no port per worker process), the broker's view of who is alive is the
one that matters (it holds the leases), and the queue dies with the connection that holds
them, so a dead holder is never waited for.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
import orjson
from aio_pika import Message
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

from bandgate.topology import naming

log = logging.getLogger(__name__)

Command = dict[str, Any]
Answer = dict[str, Any]  # {"status": int, "body": {...}}
Handler = Callable[[Command], Awaitable[Answer]]

_COMMAND = "bandgate.pull.command"
_ANSWER = "bandgate.pull.answer"


class HolderGone(Exception):
    """The process named by a receipt has no mailbox: it is gone, and so are its leases."""


class Mailbox:
    def __init__(
        self,
        connection: AbstractConnection,
        exchange: str,
        replica: str,
        handle: Handler,
        timeout: float,
    ) -> None:
        self.connection = connection
        self.exchange = exchange
        self.name = naming.replica_mailbox(exchange, replica)
        self.handle = handle
        self.timeout = timeout
        self._channel: AbstractChannel | None = None
        self._pending: dict[str, asyncio.Future[Answer]] = {}
        self._handling: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        # A robust channel declares the queue and consumes it again after a reconnect.
        channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        queue = await channel.declare_queue(self.name, exclusive=True, auto_delete=True)
        await queue.consume(self._arrived, no_ack=True)
        self._channel = channel

    async def forward(self, replica: str, command: Command) -> Answer:
        """Have process `replica` carry out `command`; its answer. `HolderGone`, or
        `TimeoutError` when it does not answer within the timeout or the broker did not take
        the command."""
        assert self._channel is not None, "open the mailbox first"
        correlation = uuid.uuid4().hex
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[correlation] = answer
        try:
            async with asyncio.timeout(self.timeout):
                try:
                    await self._channel.default_exchange.publish(
                        Message(
                            orjson.dumps(command),
                            content_type="application/json",
                            type=_COMMAND,
                            correlation_id=correlation,
                            reply_to=self.name,
                            expiration=self.timeout,
                        ),
                        routing_key=naming.replica_mailbox(self.exchange, replica),
                        mandatory=True,
                    )
                except aiormq.exceptions.PublishError:
                    raise HolderGone(replica) from None
                except aiormq.exceptions.AMQPError as exc:
                    # Not taken (a nack, a channel closing), as while the broker deletes the
                    # mailbox of a process that just died: unanswered, so "try again" (503),
                    # never a 500. A killed holder's ack was answered 500 once on RabbitMQ 4.3.
                    raise TimeoutError(f"{replica} was not sent the command: {exc!r}") from None
                return await answer
        finally:
            self._pending.pop(correlation, None)

    async def _arrived(self, message: AbstractIncomingMessage) -> None:
        if message.type == _ANSWER:
            waiting = self._pending.get(message.correlation_id or "")
            if waiting is not None and not waiting.done():
                waiting.set_result(orjson.loads(message.body))
            return
        if message.type == _COMMAND and message.reply_to:
            # In a task: a release waits for its retry copy's confirm, which must not hold up
            # the answers this mailbox is waiting for.
            task = asyncio.create_task(self._carry_out(message))
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)

    async def _carry_out(self, message: AbstractIncomingMessage) -> None:
        answer = await self.handle(orjson.loads(message.body))
        assert self._channel is not None
        assert message.reply_to is not None
        try:
            await self._channel.default_exchange.publish(
                Message(orjson.dumps(answer), type=_ANSWER, correlation_id=message.correlation_id),
                routing_key=message.reply_to,
            )
        except Exception as exc:  # the asker is gone: it answered its client already
            log.warning("could not answer a forwarded settlement: %r", exc)

    async def close(self) -> None:
        for task in list(self._handling):
            await asyncio.gather(task, return_exceptions=True)
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()
        self._channel = None


__all__ = ["Answer", "Command", "HolderGone", "Mailbox"]

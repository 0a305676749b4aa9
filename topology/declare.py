"""Applying a topology to a broker: idempotent, and clear about conflicts.

Declaring an object that exists with other arguments makes RabbitMQ close the channel with
PRECONDITION_FAILED. The declarer turns that into a `TopologyConflictError` that says which
object differs, how, and how to migrate.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, ExchangeType
from pamqp.common import Arguments

from bandgate.topology.loader import TopologyError
from bandgate.topology.management import ManagementClient
from bandgate.topology.model import Topology
from bandgate.topology.objects import (
    LEADER_LOCATOR_ARG,
    BindingDecl,
    ExchangeDecl,
    Plan,
    QueueDecl,
    plan,
)

log = logging.getLogger(__name__)

MIN_BROKER_VERSION = (3, 10)


class TopologyConflictError(TopologyError):
    """An object exists on the broker with other properties than the topology wants."""

    def __init__(self, message: str, queue: QueueDecl | None = None) -> None:
        super().__init__(message)
        self.queue = queue


class PlacedBefore(Exception):
    """A replicated queue exists without the leader locator: declared by an older bandgate."""


class QueueNotRunning(Exception):
    """A durable queue exists but its process is not up: the node is still recovering it.

    Seen on every restart of a node holding the ledger stream: a declare 0.15 s after boot
    got `NOT_FOUND - home node ... of durable queue ... is down or inaccessible`, and the same
    declare succeeded a moment later. So `apply_topology` waits for it, within a bound."""


# The broker's words for it (rabbit_amqqueue:not_found_or_absent_dirty, 3.10 to 4.3).
_NOT_RUNNING = "is down or inaccessible"
# How long `apply_topology` waits for the node to recover its queues after a restart.
RECOVERY_TIMEOUT_SECONDS = 60.0


class BrokerVersionError(TopologyError):
    """The broker is too old for what bandgate declares."""


@dataclass(frozen=True)
class ApplyReport:
    broker_version: str
    exchanges: int
    queues: int
    bindings: int
    placed_before: tuple[str, ...] = ()  # queues an older bandgate declared without placement


def broker_version(connection: AbstractConnection) -> str:
    """The server version the broker announced when the connection opened."""
    transport = connection.transport
    if transport is None:
        return "unknown"
    version = transport.connection.server_properties.get("version", b"unknown")
    return version.decode() if isinstance(version, bytes) else str(version)


def parse_version(version: str) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", version)
    return tuple(int(n) for n in numbers[:3])


def counts_every_return(version: str) -> bool:
    """Whether a quorum queue counts every return in `x-delivery-count`, a nack included.

    RabbitMQ 4.3 counts only `basic.reject` (and failed deliveries); earlier versions count
    every message given back, so a message given back unhandled moves towards the delivery
    limit there. Unknown versions are taken to count (the cautious answer)."""
    parsed = parse_version(version)
    return not parsed or parsed < (4, 3)


async def apply_topology(
    connection: AbstractConnection,
    topology: Topology,
    management: ManagementClient | None = None,
    recovery_timeout: float = RECOVERY_TIMEOUT_SECONDS,
) -> ApplyReport:
    """Declare every exchange, queue and binding of `topology`; safe to run again.

    A queue the node has not recovered yet (just after a restart) is waited for, up to
    `recovery_timeout` s, then reported as a `TopologyError`.

    With a management client, a conflicting queue is reported with all its differing
    arguments; without one, with the first difference the broker names.
    """
    version = broker_version(connection)
    parsed = parse_version(version)
    if parsed and parsed[:2] < MIN_BROKER_VERSION:
        raise BrokerVersionError(
            f"RabbitMQ {version} is too old: bandgate needs 3.10 or newer "
            "(quorum queue message TTL and at-least-once dead-lettering)"
        )
    objects = plan(topology)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + recovery_timeout
    pause = 0.1
    while True:
        try:
            placed_before = await _apply_once(connection, objects, management)
            break
        except QueueNotRunning as exc:
            if loop.time() + pause > deadline:
                raise TopologyError(
                    f"{exc}, still after {recovery_timeout:g} s: the node has not recovered "
                    "it (its log says why; `rabbitmq-queues quorum_status <queue>` shows "
                    "its members)"
                ) from None
            log.info("%s: waiting %.1f s for the node to recover it", exc, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
    log.info(
        "applied topology: %d exchanges, %d queues, %d bindings on RabbitMQ %s",
        len(objects.exchanges),
        len(objects.queues),
        len(objects.bindings),
        version,
    )
    if placed_before:
        log.warning(
            "%d replicated queue(s) were declared before bandgate placed leaders (%s, ...): "
            "their leaders stay where they are; `rabbitmq-queues rebalance all` spreads them",
            len(placed_before),
            placed_before[0],
        )
    return ApplyReport(
        version,
        len(objects.exchanges),
        len(objects.queues),
        len(objects.bindings),
        placed_before,
    )


async def _apply_once(
    connection: AbstractConnection, objects: Plan, management: ManagementClient | None
) -> tuple[str, ...]:
    declarer = _Declarer(connection)
    try:
        return await declarer.apply(objects)
    except aiormq.exceptions.ChannelNotFoundEntity as exc:
        if _NOT_RUNNING not in str(exc):
            raise
        raise QueueNotRunning(f"a queue exists but is not running yet ({exc})") from None
    except TopologyConflictError as conflict:
        if management is None or conflict.queue is None:
            raise
        existing = await management.queue(conflict.queue.name)
        if existing is None:
            raise
        raise queue_diff_error(conflict.queue, existing.get("arguments", {})) from None
    finally:
        await declarer.close()


class _Declarer:
    """Declares a plan on one channel, opening another when the broker closed it for a queue
    declared before bandgate placed leaders (the one refusal that is not a conflict)."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None

    async def channel(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        return self._channel

    async def apply(self, objects: Plan) -> tuple[str, ...]:
        """Declare everything; return the queues that were placed before (kept as they are)."""
        placed_before = []
        for exchange in objects.exchanges:
            await _declare_exchange(await self.channel(), exchange)
        for queue in objects.queues:
            try:
                await _declare_queue(await self.channel(), queue)
            except PlacedBefore:
                await _declare_queue(await self.channel(), queue.without_placement())
                placed_before.append(queue.name)
        for binding in objects.bindings:
            await _bind(await self.channel(), binding)
        return tuple(placed_before)

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()


async def _declare_exchange(channel: AbstractChannel, exchange: ExchangeDecl) -> None:
    try:
        await declare_exchange(channel, exchange)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise conflict_error("exchange", exchange.name, exc) from None


async def declare_exchange(channel: AbstractChannel, exchange: ExchangeDecl) -> None:
    """Declare one planned exchange (the same call for the declarer and the doctor's probe)."""
    try:
        await channel.declare_exchange(
            exchange.name,
            ExchangeType(exchange.type),
            durable=True,
            arguments=cast(Arguments, dict(exchange.arguments)),
        )
    except aiormq.exceptions.ConnectionCommandInvalid as exc:
        if exchange.type == "x-consistent-hash":
            raise TopologyError(
                f"exchange {exchange.name!r} needs the rabbitmq_consistent_hash_exchange plugin "
                "(a sharded band): enable it (`rabbitmq-plugins enable "
                f"rabbitmq_consistent_hash_exchange`) or remove `shards` ({exc})"
            ) from None
        raise


async def _declare_queue(channel: AbstractChannel, queue: QueueDecl) -> None:
    try:
        arguments = cast(Arguments, dict(queue.arguments))
        await channel.declare_queue(queue.name, durable=True, arguments=arguments)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        if placed_before(exc):
            raise PlacedBefore(queue.name) from None
        error = conflict_error("queue", queue.name, exc)
        raise TopologyConflictError(str(error), queue) from None


def placed_before(exc: Exception) -> bool:
    """Whether a declare was refused only for the leader locator that an older bandgate did not
    set (RabbitMQ names the first argument that differs; others are found on the next try)."""
    return f"inequivalent arg '{LEADER_LOCATOR_ARG}'" in " ".join(str(arg) for arg in exc.args)


async def _bind(channel: AbstractChannel, binding: BindingDecl) -> None:
    underlay = await channel.get_underlay_channel()
    if binding.destination_type == "queue":
        await underlay.queue_bind(binding.destination, binding.source, binding.routing_key)
    else:
        await underlay.exchange_bind(binding.destination, binding.source, binding.routing_key)


_QUEUE_ADVICE = (
    "RabbitMQ cannot change a queue's type or arguments in place: stop its consumers, "
    "move or drain its messages (e.g. with a shovel to a temporary queue), delete it, then "
    "run `bandgate topology apply` again; or give the band another name in the topology."
)


def queue_diff_error(queue: QueueDecl, existing: dict[str, Any]) -> TopologyConflictError:
    """Name every argument where the broker's queue differs from the topology's."""
    wanted: dict[str, Any] = dict(queue.arguments)
    current = dict(existing)
    current.setdefault("x-queue-type", "classic")
    differences = [
        f"{key} is {_shown(current.get(key))} on the broker, the topology wants "
        f"{_shown(wanted.get(key))}"
        for key in sorted(set(wanted) | set(current))
        if str(current.get(key)) != str(wanted.get(key))
    ]
    return TopologyConflictError(
        f"queue {queue.name!r} exists with other settings: {'; '.join(differences)}. "
        f"{_QUEUE_ADVICE}",
        queue,
    )


def _shown(value: Any) -> str:
    return "not set" if value is None else repr(value)


_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)'"
    r".*?received (?:the value )?'?(?P<wanted>[^']*)'?(?: of type '[^']*')?"
    r" but current is (?P<current>.+?)\.?$",
)


def conflict_error(kind: str, name: str, exc: Exception) -> TopologyConflictError:
    """Explain a PRECONDITION_FAILED on declare in the operator's terms."""
    text = " ".join(str(arg) for arg in exc.args)
    match = _INEQUIVALENT.search(text)
    if match:
        arg, wanted = match["arg"], match["wanted"]
        current = match["current"].strip().strip("'")
        if current.startswith("none") or current == "":
            current = "not set" + (" (a classic queue)" if arg == "x-queue-type" else "")
        else:
            current = re.sub(r"^the value '?([^']*)'?.*$", r"\1", current)
        detail = f"{arg} is {current} on the broker, the topology wants {wanted!r}"
    else:
        detail = text
    advice = (
        _QUEUE_ADVICE
        if kind == "queue"
        else "Delete the exchange (its bindings go with it) and run `bandgate topology apply`, "
        "or set another `exchange` name in the topology."
    )
    return TopologyConflictError(f"{kind} {name!r} exists with other settings: {detail}. {advice}")


__all__ = [
    "ApplyReport",
    "BrokerVersionError",
    "PlacedBefore",
    "QueueNotRunning",
    "RECOVERY_TIMEOUT_SECONDS",
    "TopologyConflictError",
    "apply_topology",
    "broker_version",
    "conflict_error",
    "parse_version",
    "placed_before",
    "queue_diff_error",
]

"""What an older bandgate declared under names this one no longer uses (`naming`'s legacy rule):
finding it, reporting it, and removing it once nothing depends on it.

The old delay ladder is left alone on purpose. Its levels still hold messages due later and keep
passing them on through their own exchanges to their own exit exchange, whose bindings still
lead to the bands, so every one arrives on time, once. The current ladder is a separate set of
objects (other names, maybe another number of levels), so no message is routed through both.
Once the old ladder is empty, `bandgate topology prune` removes it; the doctor says when.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from bandgate.topology import naming
from bandgate.topology.broker_report import Finding
from bandgate.topology.loader import TopologyError
from bandgate.topology.model import MAX_DELAY_LEVELS, Topology
from bandgate.topology.objects import plan

Role = Literal["delay", "workers"]
PRUNE_COMMAND = "bandgate topology prune"


class LegacyInUseError(TopologyError):
    """An old object still holds messages or has consumers; removing it would lose them."""


@dataclass(frozen=True)
class LegacyQueue:
    name: str
    role: Role
    messages: int
    consumers: int


@dataclass(frozen=True)
class Leftovers:
    """The old objects that exist: delay levels top level first, the order they are removed in."""

    queues: tuple[LegacyQueue, ...]
    exchanges: tuple[str, ...]

    @property
    def delayed(self) -> int:
        return sum(q.messages for q in self.queues if q.role == "delay")

    def __bool__(self) -> bool:
        return bool(self.queues or self.exchanges)


def legacy_queues(topology: Topology) -> dict[str, Role]:
    """Every name an older bandgate may have given a queue of this topology, top level first;
    a name the current topology uses itself is not legacy."""
    planned = {queue.name for queue in plan(topology).queues}
    exchange = topology.exchange
    names: dict[str, Role] = {
        naming.legacy_delay_level(exchange, level): "delay"
        for level in reversed(range(MAX_DELAY_LEVELS))
    }
    names |= {
        naming.legacy_workers_queue(exchange, spec.name): "workers"
        for spec in topology.queues.values()
        if spec.shares_shards
    }
    return {name: role for name, role in names.items() if name not in planned}


def legacy_exchanges(topology: Topology) -> list[str]:
    """Old exchanges in the order they are removed: the levels, then the exit they lead to."""
    planned = {exchange.name for exchange in plan(topology).exchanges}
    names = [naming.legacy_delay_level(topology.exchange, k) for k in range(MAX_DELAY_LEVELS)]
    names.append(naming.legacy_delay_exit_exchange(topology.exchange))
    return [name for name in names if name not in planned]


def from_management(
    topology: Topology,
    queues: Iterable[Mapping[str, Any]],
    exchanges: Iterable[Mapping[str, Any]],
) -> Leftovers:
    """The old objects among the management API's queues and exchanges of the vhost."""
    existing = {str(q.get("name")): q for q in queues}
    found = [
        LegacyQueue(
            name,
            role,
            int(existing[name].get("messages") or 0),
            int(existing[name].get("consumers") or 0),
        )
        for name, role in legacy_queues(topology).items()
        if name in existing
    ]
    have = {str(e.get("name")) for e in exchanges}
    return Leftovers(tuple(found), tuple(n for n in legacy_exchanges(topology) if n in have))


async def probe(connection: AbstractConnection, topology: Topology) -> Leftovers:
    """The old objects, found over AMQP by passive declares (which also count messages).

    Old levels exist from 0 up (the old ladder was declared whole, and prune removes it from the
    top), so the search stops at the first missing level: one declare when there is none.
    """
    passive = _Passive(connection)
    try:
        names = legacy_queues(topology)
        found: list[LegacyQueue] = []
        for name in reversed([n for n, role in names.items() if role == "delay"]):
            queue = await passive.queue(name, "delay")
            if queue is None:
                break
            found.insert(0, queue)
        for name in (n for n, role in names.items() if role == "workers"):
            if (queue := await passive.queue(name, "workers")) is not None:
                found.append(queue)
        exit_exchange = naming.legacy_delay_exit_exchange(topology.exchange)
        candidates = legacy_exchanges(topology)
        exchanges: list[str] = []
        for name in candidates:  # levels from 0 up, as for the queues
            if name == exit_exchange or not await passive.exchange(name):
                break
            exchanges.append(name)
        if exit_exchange in candidates and await passive.exchange(exit_exchange):
            exchanges.append(exit_exchange)
        return Leftovers(tuple(found), tuple(exchanges))
    finally:
        await passive.close()


async def prune(
    connection: AbstractConnection, topology: Topology, force: bool = False
) -> Leftovers:
    """Remove the old objects; refuse while an old delay level holds a message or an old
    workers queue has a consumer, unless `force` (then their messages are lost).

    Quorum queues refuse `queue.delete` with if-empty or if-unused, so each queue is counted
    again just before it goes. The levels go from the top down: messages only move down the
    ladder, so once the levels above are gone (and no old gateway publishes) nothing can enter
    a level between its count and its removal. A level that took a message stops the removal
    with everything below it and every exchange in place, so that message still arrives. The
    exchanges go last, the exit exchange after the levels that lead to it.
    """
    found = await probe(connection, topology)
    busy = [q for q in found.queues if _busy_now(q)]
    if busy and not force:
        raise LegacyInUseError(
            f"{_busy(busy)}. Wait until that is over, or pass --force to lose them"
        )
    passive = _Passive(connection)
    channel = await connection.channel(publisher_confirms=False)
    try:
        for queue in found.queues:
            now = await passive.queue(queue.name, queue.role)
            if now is not None and _busy_now(now) and not force:
                raise LegacyInUseError(
                    f"{_busy([now])}: it took them while the queues above it were removed, so "
                    f"it, the levels below and the exchanges stay; run `{PRUNE_COMMAND}` again "
                    "once it is empty"
                )
            await channel.queue_delete(queue.name)
        for name in found.exchanges:
            await channel.exchange_delete(name)
    finally:
        await passive.close()
        if not channel.is_closed:
            await channel.close()
    return found


def _busy_now(queue: LegacyQueue) -> bool:
    return bool(queue.messages or (queue.role == "workers" and queue.consumers))


def _busy(queues: list[LegacyQueue]) -> str:
    delayed = [q for q in queues if q.role == "delay"]
    parts = []
    if delayed:
        counts = ", ".join(f"{q.name} {q.messages}" for q in delayed)
        parts.append(
            f"the old delay ladder still holds {sum(q.messages for q in delayed)} message(s) "
            f"({counts}); it delivers them when they are due"
        )
    parts += [
        f"{q.name} still has {q.consumers} consumer(s): workers of an older bandgate"
        for q in queues
        if q.role == "workers"
    ]
    return "; ".join(parts)


def findings(leftovers: Leftovers) -> list[Finding]:
    """What the doctor says about the old objects that exist."""
    out: list[Finding] = []
    levels = [q for q in leftovers.queues if q.role == "delay"]
    if levels:
        span = levels[-1].name + (f" .. {levels[0].name}" if len(levels) > 1 else "")
        held = leftovers.delayed
        state = (
            f"still holds {held} message(s), which it delivers when due: leave it until it "
            f"holds none (this check counts them), then remove it with `{PRUNE_COMMAND}`"
            if held
            else f"is empty: remove it with `{PRUNE_COMMAND}`"
        )
        out.append(
            Finding.warning(
                "legacy_delay_ladder",
                "old delay ladder",
                f"{span} ({len(levels)} levels, named by an older bandgate) {state}",
            )
        )
    elif leftovers.exchanges:
        out.append(
            Finding.warning(
                "legacy_delay_ladder",
                "old delay ladder",
                f"exchanges of an older bandgate's delay ladder remain "
                f"({', '.join(leftovers.exchanges[:3])}{' ...' * (len(leftovers.exchanges) > 3)})"
                f": remove them with `{PRUNE_COMMAND}`",
            )
        )
    out += [
        Finding.warning(
            "legacy_workers_queue",
            queue.name,
            f"workers queue named by an older bandgate ({queue.consumers} consumer(s)): once "
            f"no worker of that version runs, remove it with `{PRUNE_COMMAND}`",
        )
        for queue in leftovers.queues
        if queue.role == "workers"
    ]
    return out


class _Passive:
    """Passive declares on one channel, reopened after each 404 (the broker closes it)."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None

    async def _open(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        return self._channel

    async def queue(self, name: str, role: Role) -> LegacyQueue | None:
        try:
            declared = await (await self._open()).declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        result = declared.declaration_result
        return LegacyQueue(name, role, result.message_count or 0, result.consumer_count or 0)

    async def exchange(self, name: str) -> bool:
        try:
            await (await self._open()).declare_exchange(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return False
        return True

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()


__all__ = [
    "LegacyInUseError",
    "LegacyQueue",
    "Leftovers",
    "findings",
    "from_management",
    "legacy_exchanges",
    "legacy_queues",
    "probe",
    "prune",
]

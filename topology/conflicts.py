"""Queues and exchanges that already exist on the broker with other settings than the topology's.

Part of the broker check (`topology.doctor`). With the management API the existing objects are
compared with the plan; without it they are probed by declaring them again (a declare that
matches changes nothing; one that differs is refused and says how).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from pamqp.common import Arguments

from bandgate.topology.broker_report import Finding, listed
from bandgate.topology.declare import (
    conflict_error,
    declare_exchange,
    placed_before,
    queue_diff_error,
)
from bandgate.topology.model import Topology
from bandgate.topology.objects import LEADER_LOCATOR_ARG, ExchangeDecl, QueueDecl, plan


def queue_conflicts(topology: Topology, existing: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """Planned queues that exist on the broker with other arguments, or are missing."""
    findings: list[Finding] = []
    missing: list[str] = []
    placed_before: list[str] = []
    for decl in plan(topology).queues:
        current = existing.get(decl.name)
        if current is None:
            missing.append(decl.name)
            continue
        arguments = dict(current.get("arguments") or {})
        if current.get("type") and "x-queue-type" not in arguments:
            arguments["x-queue-type"] = current["type"]
        if LEADER_LOCATOR_ARG not in arguments and decl.replicated:
            placed_before.append(decl.name)
            decl = decl.without_placement()
        wanted = {k: str(v) for k, v in dict(decl.arguments).items()}
        have = {k: str(v) for k, v in arguments.items()}
        have.setdefault("x-queue-type", "classic")
        if wanted != have:
            findings.append(
                Finding.error("queue_conflict", decl.name, str(queue_diff_error(decl, arguments)))
            )
    if missing:
        findings.append(_missing(missing))
    if placed_before:
        findings.append(_placed_before(placed_before))
    return findings


def _placed_before(names: list[str]) -> Finding:
    return Finding.info(
        "leaders_not_placed",
        "topology",
        f"{len(names)} replicated queue(s) were declared before bandgate placed their leaders "
        f"({listed(names)}): their leaders stay where RabbitMQ put them; on a cluster, "
        "`rabbitmq-queues rebalance all` spreads them",
    )


def _missing(names: list[str]) -> Finding:
    return Finding.info(
        "queue_missing",
        "topology",
        f"{len(names)} queue(s) not declared yet ({listed(names)}): `bandgate topology apply`, the "
        "gateway and the workers declare them",
    )


def exchange_conflicts(topology: Topology, existing: Mapping[str, str]) -> list[Finding]:
    return [
        Finding.error(
            "exchange_conflict",
            exchange.name,
            f"exchange exists as type {existing[exchange.name]!r}, the topology wants "
            f"{exchange.type!r}: delete it (its bindings go with it) and apply the topology",
        )
        for exchange in plan(topology).exchanges
        if exchange.name in existing and existing[exchange.name] != exchange.type
    ]


async def probe_declared(connection: AbstractConnection, topology: Topology) -> list[Finding]:
    """Without a management API: declare what exists again with the topology's settings."""
    objects = plan(topology)
    prober = _Prober(connection)
    findings: list[Finding] = []
    missing: list[str] = []
    try:
        for exchange in objects.exchanges:
            findings += await prober.exchange(exchange)
        for queue in objects.queues:
            result = await prober.queue(queue)
            if result is None:
                missing.append(queue.name)
            else:
                findings += result
    finally:
        await prober.close()
    if missing:
        findings.append(_missing(missing))
    if prober.placed_before:
        findings.append(_placed_before(prober.placed_before))
    return findings


class _Prober:
    """Passive then matching declares; the broker closes the channel on a refusal, so a new
    one is opened for the next object."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None
        self.placed_before: list[str] = []

    async def _open(self) -> AbstractChannel:
        if self._channel is None or self._channel.is_closed:
            self._channel = await self._connection.channel(publisher_confirms=False)
        return self._channel

    async def exchange(self, exchange: ExchangeDecl) -> list[Finding]:
        try:
            channel = await self._open()
            await channel.declare_exchange(exchange.name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return []
        try:
            channel = await self._open()
            await declare_exchange(channel, exchange)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            return [
                Finding.error(
                    "exchange_conflict",
                    exchange.name,
                    str(conflict_error("exchange", exchange.name, exc)),
                )
            ]
        return []

    async def queue(self, queue: QueueDecl) -> list[Finding] | None:
        try:
            channel = await self._open()
            await channel.declare_queue(queue.name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        try:
            await self._declare(queue)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            if not placed_before(exc):
                return [_conflict(queue, exc)]
            self.placed_before.append(queue.name)
            try:
                await self._declare(queue.without_placement())
            except aiormq.exceptions.ChannelPreconditionFailed as again:
                return [_conflict(queue, again)]
        return []

    async def _declare(self, queue: QueueDecl) -> None:
        channel = await self._open()
        arguments = cast(Arguments, dict(queue.arguments))
        await channel.declare_queue(queue.name, durable=True, arguments=arguments)

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()


def _conflict(queue: QueueDecl, exc: Exception) -> Finding:
    return Finding.error(
        "queue_conflict", queue.name, str(conflict_error("queue", queue.name, exc))
    )


__all__ = ["exchange_conflicts", "probe_declared", "queue_conflicts"]

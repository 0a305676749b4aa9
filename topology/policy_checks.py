"""What RabbitMQ policies (and 4.x defaults) do to the planned queues that the topology does not:
a TTL or length limit that drops or promotes messages, a delivery limit that loops them.

Part of the broker check (`topology.doctor`), kept apart because it is pure: it takes the
policies as read and decides, so it is tested without a broker.

How policies combine with queue arguments (RabbitMQ's rules, which the checks follow): for
message-ttl, expires, max-length, max-length-bytes and delivery-limit the lowest value applies;
for dead-letter-exchange, dead-letter-routing-key, overflow and dead-letter-strategy the queue's
own argument wins over any policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bandgate.topology import naming
from bandgate.topology.broker_report import Finding
from bandgate.topology.model import Band, Topology
from bandgate.topology.objects import QueueDecl, plan

Role = Literal["band", "dlq", "delay", "workers", "ledger"]

# Quorum queues on 4.x dead-letter (or drop) a message returned this often unless told otherwise.
DEFAULT_DELIVERY_LIMIT_4X = 20
_NUMERIC_KEYS = ("message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit")


@dataclass(frozen=True)
class Policy:
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: Mapping[str, Any]


def _matches(policy: Policy, name: str, queue_type: str) -> bool:
    targets = {"queues", "all", f"{queue_type}_queues"}
    if policy.apply_to not in targets:
        return False
    try:
        return re.search(policy.pattern, name) is not None
    except re.error:
        return False


def effective_policy(
    name: str,
    queue_type: str,
    policies: Iterable[Policy],
    operator_policies: Iterable[Policy] = (),
) -> tuple[str | None, dict[str, Any]]:
    """(policy names, definition) that apply to a queue: the highest-priority matching policy,
    merged with the highest-priority operator policy (the lower number wins where both set one).
    """
    chosen = [
        max(matching, key=lambda p: p.priority)
        for group in (policies, operator_policies)
        if (matching := [p for p in group if _matches(p, name, queue_type)])
    ]
    if not chosen:
        return None, {}
    merged: dict[str, Any] = {}
    for policy in chosen:
        for key, value in policy.definition.items():
            if key in merged and key in _NUMERIC_KEYS and _is_number(value):
                merged[key] = min(merged[key], value) if _is_number(merged[key]) else value
            else:
                merged[key] = value
    return " + ".join(p.name for p in chosen), merged


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: object) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _queue_roles(topology: Topology) -> dict[str, tuple[Role, str, Band | None]]:
    """Every planned queue's role, logical queue (or '' for delay levels) and band."""
    roles: dict[str, tuple[Role, str, Band | None]] = {
        naming.ledger_stream(topology.exchange): ("ledger", "", None)
    }
    for level in range(topology.ladder.levels):
        roles[naming.delay_level(topology.exchange, level)] = ("delay", "", None)
    for spec in topology.queues.values():
        for band in spec.bands:
            for name in spec.band_queues(band):
                roles[name] = ("band", spec.name, band)
        roles[naming.dead_letter_queue(spec.name)] = ("dlq", spec.name, None)
        roles[naming.workers_queue(topology.exchange, spec.name)] = ("workers", spec.name, None)
    return roles


def policy_findings(
    topology: Topology,
    version: tuple[int, ...],
    policies: Iterable[Policy],
    operator_policies: Iterable[Policy] = (),
) -> list[Finding]:
    """What policies (and 4.x defaults) do to the planned queues that the topology does not."""
    policies, operator_policies = list(policies), list(operator_policies)
    roles = _queue_roles(topology)
    findings: list[Finding] = []
    for decl in plan(topology).queues:
        role, queue, band = roles[decl.name]
        if role in ("workers", "ledger"):
            continue  # workers: holds no messages, only its consumer count matters; the
            # ledger: a stream, trimmed by its own retention, not by these checks' keys
        queue_type = str(decl.arguments.get("x-queue-type", "classic"))
        source, definition = effective_policy(decl.name, queue_type, policies, operator_policies)
        where = f"policy {source!r}" if source else ""
        findings += _ttl_and_length(decl, role, queue, band, topology, definition, where)
        if queue_type == "quorum" and role != "delay":
            findings += _delivery_limit(
                decl, role, queue, band, topology, version, definition, where
            )
    return findings


def _ttl_and_length(
    decl: QueueDecl,
    role: Role,
    queue: str,
    band: Band | None,
    topology: Topology,
    definition: Mapping[str, Any],
    where: str,
) -> list[Finding]:
    out: list[Finding] = []
    dlq = naming.dead_letter_queue(queue) if queue else ""
    ttl, own_ttl = _number(definition.get("message-ttl")), decl.arguments.get("x-message-ttl")
    if ttl is not None and (own_ttl is None or ttl < own_ttl):
        if role == "delay":
            effect = f"delays through this level end after {ttl} ms instead of {own_ttl} ms"
        elif role == "dlq":
            target = definition.get("dead-letter-exchange")
            effect = (
                f"dead letters expire into exchange {target!r}"
                if target
                else "dead letters expire and are dropped"
            )
        elif own_ttl is not None and band is not None:
            above = topology.queue(queue).band_above(band)
            effect = f"waiting messages are promoted to {above.name if above else '?'} early"
        else:
            effect = f"messages waiting longer are dead-lettered to {dlq} without being handled"
        out.append(
            Finding.error(
                "policy_message_ttl", decl.name, f"{where} sets message-ttl {ttl} ms: {effect}"
            )
        )
    expires = definition.get("expires")
    if _is_number(expires):
        out.append(
            Finding.error(
                "policy_expires",
                decl.name,
                f"{where} sets expires {expires} ms: the queue is deleted, with its messages, "
                "once it has had no consumer that long",
            )
        )
    for key in ("max-length", "max-length-bytes"):
        limit = definition.get(key)
        if not _is_number(limit):
            continue
        if role == "dlq" and definition.get("overflow", "drop-head") == "drop-head":
            out.append(
                Finding.error(
                    "policy_max_length",
                    decl.name,
                    f"{where} sets {key} {limit} with drop-head: the oldest dead letters are "
                    "dropped beyond it",
                )
            )
        else:
            out.append(
                Finding.warning(
                    "policy_max_length",
                    decl.name,
                    f"{where} sets {key} {limit}: beyond it the queue refuses messages "
                    "(publishes answer 503, dead-lettering into it waits)",
                )
            )
    for key in ("dead-letter-exchange", "dead-letter-routing-key", "overflow"):
        if key in definition and f"x-{key}" in decl.arguments:
            out.append(
                Finding.info(
                    "policy_ignored",
                    decl.name,
                    f"{where} sets {key}, which the queue's own x-{key} overrides",
                )
            )
    return out


def _delivery_limit(
    decl: QueueDecl,
    role: Role,
    queue: str,
    band: Band | None,
    topology: Topology,
    version: tuple[int, ...],
    definition: Mapping[str, Any],
    where: str,
) -> list[Finding]:
    limit = _number(definition.get("delivery-limit"))
    source = where
    if limit is None:
        if version < (4, 0):
            return []
        limit, source = DEFAULT_DELIVERY_LIMIT_4X, "RabbitMQ 4.x's default"
    if limit < 0:  # 4.x: -1 is unlimited
        return []
    spec = topology.queue(queue)
    dlq = naming.dead_letter_queue(queue)
    if role == "dlq":
        if version >= (4, 3):
            return []  # 4.3 stopped counting basic.nack returns
        target = definition.get("dead-letter-exchange")
        fate = f"moved to exchange {target!r}" if target else "dropped"
        return [
            Finding.warning(
                "dlq_delivery_limit",
                decl.name,
                f"delivery-limit {limit} ({source}): `bandgate dlq list` returns what it reads, "
                f"and each return counts, so a dead letter listed {limit} times is {fate}; "
                + (
                    "remove the policy's delivery-limit"
                    if version < (4, 0)
                    else f"set delivery-limit -1 on {dlq} with a policy"
                ),
            )
        ]
    assert band is not None
    above = spec.band_above(band)
    if limit < spec.retry.max_deliveries:
        fate = (
            f"into band {above.name!r} (this band's dead-letter route is its aging), so it loops"
            if band.age_after_seconds is not None and above is not None
            else f"to {dlq} without bandgate's failure headers"
        )
        return [
            Finding.error(
                "delivery_limit",
                decl.name,
                f"delivery-limit {limit} ({source}) is below the queue's max_deliveries "
                f"{spec.retry.max_deliveries}: the broker dead-letters a message returned "
                f"{limit} times before the worker counts it, {fate}",
            )
        ]
    if limit < spec.retry.max_attempts:
        return [
            Finding.warning(
                "delivery_limit",
                decl.name,
                f"delivery-limit {limit} ({source}) is below max_attempts "
                f"{spec.retry.max_attempts}: harmless while retries are republished (each "
                "attempt is a new message), but keep it at or above max_attempts",
            )
        ]
    return []


__all__ = ["DEFAULT_DELIVERY_LIMIT_4X", "Policy", "effective_policy", "policy_findings"]

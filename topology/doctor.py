"""The broker check: what the broker is, what order it keeps inside each band, and what in its
configuration would lose or loop messages.

The gateway and the workers run it at start-up (refusing to start on an error) and `bandgate
doctor` prints it. It reads the broker's version and capabilities from the AMQP handshake and,
with a management URL, the overview, queues, exchanges, policies and feature flags; without one,
existing queues are compared with the topology by declaring them (a declare that matches changes
nothing; one that differs is refused and says how).

How policies combine with queue arguments (RabbitMQ's rules, which the checks follow): for
message-ttl, expires, max-length, max-length-bytes and delivery-limit the lowest value applies;
for dead-letter-exchange, dead-letter-routing-key, overflow and dead-letter-strategy the queue's
own argument wins over any policy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast
from urllib.parse import quote

import aiormq
import httpx
from aio_pika.abc import AbstractChannel, AbstractConnection
from pamqp.common import Arguments

from topology import naming
from topology.declare import (
    MIN_BROKER_VERSION,
    broker_version,
    conflict_error,
    declare_exchange,
    parse_version,
    queue_diff_error,
)
from topology.loader import TopologyError
from topology.management import split_credentials
from topology.model import Band, Topology
from topology.objects import ExchangeDecl, QueueDecl, plan

log = logging.getLogger(__name__)

Severity = Literal["error", "warning", "info"]
Role = Literal["band", "dlq", "delay", "workers"]

# Quorum queues on 4.x dead-letter (or drop) a message returned this often unless told otherwise.
DEFAULT_DELIVERY_LIMIT_4X = 20
_NUMERIC_KEYS = ("message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit")


class BrokerCheckError(TopologyError):
    """The broker's configuration would lose or loop messages; the message lists why."""


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str
    subject: str  # what it is about: a queue, a policy, the broker
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.message}"


@dataclass(frozen=True)
class BandOrdering:
    queue: str
    band: str
    rabbitmq_queue: str
    queue_type: str
    ordering: str  # "FIFO within band", "two levels within band", ...
    detail: str


@dataclass(frozen=True)
class Policy:
    name: str
    pattern: str
    apply_to: str
    priority: int
    definition: Mapping[str, Any]


@dataclass(frozen=True)
class BrokerReport:
    version: str
    product: str
    cluster_name: str | None
    erlang_version: str | None
    management_version: str | None
    capabilities: tuple[str, ...]
    ordering: tuple[BandOrdering, ...]
    findings: tuple[Finding, ...]

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "warning")

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        erlang = f" on Erlang {self.erlang_version}" if self.erlang_version else ""
        cluster = f", cluster {self.cluster_name!r}" if self.cluster_name else ""
        api = (
            f", management API {self.management_version}"
            if self.management_version
            else ", no management API"
        )
        return f"{self.product} {self.version}{erlang}{cluster}{api}"

    def raise_for_errors(self) -> None:
        """Raise `BrokerCheckError` naming every error, when there is one."""
        if self.errors:
            problems = "; ".join(str(finding) for finding in self.errors)
            raise BrokerCheckError(
                f"RabbitMQ {self.version} has a configuration that would lose or loop "
                f"messages: {problems}"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "product": self.product,
            "cluster_name": self.cluster_name,
            "erlang_version": self.erlang_version,
            "management_version": self.management_version,
            "capabilities": list(self.capabilities),
            "ordering": [vars(item) for item in self.ordering],
            "findings": [vars(item) for item in self.findings],
            "ok": self.ok,
        }


def log_report(report: BrokerReport, logger: logging.Logger = log) -> None:
    """Log what a process should say at start-up: the broker, in-band order, the findings."""
    logger.info("broker: %s", report.summary())
    for item in report.ordering:
        logger.info("in-band order of %s: %s (%s)", item.rabbitmq_queue, item.ordering, item.detail)
    for finding in report.findings:
        level = {"error": logging.ERROR, "warning": logging.WARNING}.get(
            finding.severity, logging.INFO
        )
        logger.log(level, "broker check: %s", finding)


# Pure rules.


def band_ordering(version: tuple[int, ...], band: Band) -> tuple[str, str]:
    """(label, detail) of the order a band's queue keeps among its own messages."""
    if band.type == "classic":
        return (
            "exact priority within band",
            f"classic queue with x-max-priority {band.high}: higher priority first, FIFO "
            "within a priority",
        )
    if not version or version < (4, 0):
        return "FIFO within band", "quorum queues on RabbitMQ 3.x ignore message priority"
    if version < (4, 3):
        return (
            "two levels within band",
            "quorum queues on RabbitMQ 4.0-4.2 deliver priorities 5-9 ahead of 0-4 by a "
            "ratio, FIFO within each level",
        )
    return "strict priority within band", "quorum queues on RabbitMQ 4.3+ order by priority"


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
    roles: dict[str, tuple[Role, str, Band | None]] = {}
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
        if role == "workers":
            continue  # holds no messages; only its consumer count matters
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
            _error("policy_message_ttl", decl.name, f"{where} sets message-ttl {ttl} ms: {effect}")
        )
    expires = definition.get("expires")
    if _is_number(expires):
        out.append(
            _error(
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
                _error(
                    "policy_max_length",
                    decl.name,
                    f"{where} sets {key} {limit} with drop-head: the oldest dead letters are "
                    "dropped beyond it",
                )
            )
        else:
            out.append(
                _warning(
                    "policy_max_length",
                    decl.name,
                    f"{where} sets {key} {limit}: beyond it the queue refuses messages "
                    "(publishes answer 503, dead-lettering into it waits)",
                )
            )
    for key in ("dead-letter-exchange", "dead-letter-routing-key", "overflow"):
        if key in definition and f"x-{key}" in decl.arguments:
            out.append(
                _info(
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
            _warning(
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
            _error(
                "delivery_limit",
                decl.name,
                f"delivery-limit {limit} ({source}) is below the queue's max_deliveries "
                f"{spec.retry.max_deliveries}: the broker dead-letters a message returned "
                f"{limit} times before the worker counts it, {fate}",
            )
        ]
    if limit < spec.retry.max_attempts:
        return [
            _warning(
                "delivery_limit",
                decl.name,
                f"delivery-limit {limit} ({source}) is below max_attempts "
                f"{spec.retry.max_attempts}: harmless while retries are republished (each "
                "attempt is a new message), but keep it at or above max_attempts",
            )
        ]
    return []


def queue_conflicts(topology: Topology, existing: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """Planned queues that exist on the broker with other arguments, or are missing."""
    findings: list[Finding] = []
    missing: list[str] = []
    for decl in plan(topology).queues:
        current = existing.get(decl.name)
        if current is None:
            missing.append(decl.name)
            continue
        arguments = dict(current.get("arguments") or {})
        if current.get("type") and "x-queue-type" not in arguments:
            arguments["x-queue-type"] = current["type"]
        wanted = {k: str(v) for k, v in dict(decl.arguments).items()}
        have = {k: str(v) for k, v in arguments.items()}
        have.setdefault("x-queue-type", "classic")
        if wanted != have:
            findings.append(
                _error("queue_conflict", decl.name, str(queue_diff_error(decl, arguments)))
            )
    if missing:
        findings.append(_missing(missing))
    return findings


def _missing(names: list[str]) -> Finding:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return _info(
        "queue_missing",
        "topology",
        f"{len(names)} queue(s) not declared yet ({shown}): `bandgate topology apply`, the "
        "gateway and the workers declare them",
    )


def _error(code: str, subject: str, message: str) -> Finding:
    return Finding("error", code, subject, message)


def _warning(code: str, subject: str, message: str) -> Finding:
    return Finding("warning", code, subject, message)


def _info(code: str, subject: str, message: str) -> Finding:
    return Finding("info", code, subject, message)


# Reading the broker.


async def check_broker(
    connection: AbstractConnection,
    topology: Topology,
    management_url: str | None = None,
    vhost: str = "/",
    http_timeout: float = 5.0,
) -> BrokerReport:
    """Check the broker behind `connection` against `topology` (in `vhost`)."""
    properties = _server_properties(connection)
    version = broker_version(connection)
    parsed = parse_version(version)
    findings: list[Finding] = []
    if parsed and parsed[:2] < MIN_BROKER_VERSION:
        findings.append(
            _error("broker_too_old", "broker", f"RabbitMQ {version} is older than 3.10")
        )
    overview: dict[str, Any] = {}
    if management_url:
        try:
            overview, more = await _read_management(
                management_url, vhost, topology, parsed, http_timeout
            )
            findings += more
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            problem = (
                f"HTTP {exc.response.status_code} from {exc.request.url.path}"
                if isinstance(exc, httpx.HTTPStatusError)
                else f"{type(exc).__name__}: {exc}"
            )
            findings.append(
                _warning(
                    "management_unavailable",
                    "management API",
                    f"cannot read it ({problem}); queues were checked by declaring them, "
                    "policies and plugins not at all",
                )
            )
            findings += await _probe_declared(connection, topology)
    else:
        findings.append(
            _info(
                "no_management",
                "management API",
                "no management URL: policies, feature flags and plugins not checked",
            )
        )
        findings += await _probe_declared(connection, topology)
    ordering = tuple(
        BandOrdering(
            spec.name,
            band.name,
            ", ".join(spec.band_queues(band)),
            band.type,
            *band_ordering(parsed, band),
        )
        for spec in topology.queues.values()
        for band in spec.bands
    )
    capabilities = properties.get("capabilities") or {}
    return BrokerReport(
        version=version,
        product=_text(overview.get("product_name") or properties.get("product")) or "RabbitMQ",
        cluster_name=_text(overview.get("cluster_name") or properties.get("cluster_name")),
        erlang_version=_text(overview.get("erlang_version"))
        or (_text(properties.get("platform")) or "").removeprefix("Erlang/OTP ")
        or None,
        management_version=_text(overview.get("management_version")),
        capabilities=tuple(sorted(k for k, v in capabilities.items() if v is True)),
        ordering=ordering,
        findings=tuple(
            sorted(findings, key=lambda f: ("error", "warning", "info").index(f.severity))
        ),
    )


def _server_properties(connection: AbstractConnection) -> Mapping[str, Any]:
    transport = connection.transport
    if transport is None:
        return {}
    return transport.connection.server_properties or {}


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


async def _read_management(
    url: str, vhost: str, topology: Topology, version: tuple[int, ...], http_timeout: float
) -> tuple[dict[str, Any], list[Finding]]:
    base, auth = split_credentials(url)
    encoded = quote(vhost, safe="")
    async with httpx.AsyncClient(base_url=base, auth=auth, timeout=http_timeout) as api:

        async def get(path: str, optional: bool = False) -> Any:
            response = await api.get(path)
            if optional and response.status_code in (401, 403, 404):
                unreadable.append(path.split("/")[2])
                return []  # this user may not read it (policies need the policymaker tag)
            response.raise_for_status()
            return response.json()

        unreadable: list[str] = []
        overview: dict[str, Any] = await get("/api/overview")
        queues: list[dict[str, Any]] = await get(f"/api/queues/{encoded}")
        exchanges: list[dict[str, Any]] = await get(f"/api/exchanges/{encoded}")
        policies = [_policy(p) for p in await get(f"/api/policies/{encoded}", optional=True)]
        operator = [
            _policy(p) for p in await get(f"/api/operator-policies/{encoded}", optional=True)
        ]
        flags: list[dict[str, Any]] = await get("/api/feature-flags", optional=True)
    findings = queue_conflicts(topology, {q["name"]: q for q in queues})
    if unreadable:
        findings.append(
            _warning(
                "management_forbidden",
                "management API",
                f"this user may not read {', '.join(unreadable)}: not checked",
            )
        )
    findings += exchange_conflicts(topology, {e["name"]: str(e.get("type")) for e in exchanges})
    findings += policy_findings(topology, version, policies, operator)
    types = {str(item.get("name")) for item in overview.get("exchange_types", [])}
    if "x-consistent-hash" not in types:
        findings.append(consistent_hash_missing(topology))
    states = {str(flag.get("name")): str(flag.get("state")) for flag in flags}
    if states.get("stream_queue", "enabled") != "enabled":
        findings.append(
            _error(
                "feature_flag",
                "feature flags",
                "stream_queue is not enabled: quorum queues then dead-letter at-most-once, and "
                "the delay ladder and the bands can lose messages on the way; enable it",
            )
        )
    return overview, findings


def _policy(item: Mapping[str, Any]) -> Policy:
    return Policy(
        name=str(item.get("name")),
        pattern=str(item.get("pattern", "")),
        apply_to=str(item.get("apply-to", "all")),
        priority=int(item.get("priority", 0)),
        definition=dict(item.get("definition") or {}),
    )


def consistent_hash_missing(topology: Topology) -> Finding:
    """The finding for a broker without the consistent-hash exchange: an error when a band is
    sharded (its exchange cannot be declared), a warning otherwise."""
    sharded = [
        f"{spec.name}.{band.name}"
        for spec in topology.queues.values()
        for band in spec.bands
        if band.shards > 1
    ]
    if sharded:
        return _error(
            "consistent_hash_missing",
            "plugins",
            "rabbitmq_consistent_hash_exchange is not enabled, and sharded bands need it "
            f"({', '.join(sharded)}): enable it",
        )
    return _warning(
        "consistent_hash_missing",
        "plugins",
        "rabbitmq_consistent_hash_exchange is not enabled: bands cannot be sharded "
        "(`shards`) on this broker",
    )


def exchange_conflicts(topology: Topology, existing: Mapping[str, str]) -> list[Finding]:
    return [
        _error(
            "exchange_conflict",
            exchange.name,
            f"exchange exists as type {existing[exchange.name]!r}, the topology wants "
            f"{exchange.type!r}: delete it (its bindings go with it) and apply the topology",
        )
        for exchange in plan(topology).exchanges
        if exchange.name in existing and existing[exchange.name] != exchange.type
    ]


async def _probe_declared(connection: AbstractConnection, topology: Topology) -> list[Finding]:
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
    return findings


class _Prober:
    """Passive then matching declares; the broker closes the channel on a refusal, so a new
    one is opened for the next object."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection
        self._channel: AbstractChannel | None = None

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
                _error(
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
            channel = await self._open()
            arguments = cast(Arguments, dict(queue.arguments))
            await channel.declare_queue(queue.name, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            return [
                _error("queue_conflict", queue.name, str(conflict_error("queue", queue.name, exc)))
            ]
        return []

    async def close(self) -> None:
        if self._channel is not None and not self._channel.is_closed:
            await self._channel.close()


__all__ = [
    "DEFAULT_DELIVERY_LIMIT_4X",
    "BandOrdering",
    "BrokerCheckError",
    "BrokerReport",
    "Finding",
    "Policy",
    "band_ordering",
    "check_broker",
    "consistent_hash_missing",
    "effective_policy",
    "exchange_conflicts",
    "log_report",
    "policy_findings",
    "queue_conflicts",
]

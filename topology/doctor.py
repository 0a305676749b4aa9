"""The broker check: what the broker is, what order it keeps inside each band, and what in its
configuration would lose or loop messages.

The gateway and the workers run it at start-up (refusing to start on an error, after
`log_report`) and `bandgate doctor` prints it. It reads the broker's version and capabilities
from the AMQP handshake and, with a management URL, the overview, queues, exchanges, policies and
feature flags; without one, existing queues are compared with the topology by declaring them
(`topology.conflicts`). The report types live in `topology.broker_report`, the policy rules in
`topology.policy_checks`, what an older bandgate left behind in `topology.legacy`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
from aio_pika.abc import AbstractConnection

from bandgate.topology import legacy
from bandgate.topology.broker_report import BandOrdering, BrokerReport, Finding
from bandgate.topology.conflicts import exchange_conflicts, probe_declared, queue_conflicts
from bandgate.topology.declare import MIN_BROKER_VERSION, broker_version, parse_version
from bandgate.topology.management import split_credentials
from bandgate.topology.model import Band, Topology
from bandgate.topology.placement import placement_findings
from bandgate.topology.policy_checks import Policy, policy_findings

log = logging.getLogger(__name__)


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
            Finding.error("broker_too_old", "broker", f"RabbitMQ {version} is older than 3.10")
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
                Finding.warning(
                    "management_unavailable",
                    "management API",
                    f"cannot read it ({problem}); queues were checked by declaring them, "
                    "policies and plugins not at all",
                )
            )
            findings += await probe_declared(connection, topology)
            findings += legacy.findings(await legacy.probe(connection, topology))
    else:
        findings.append(
            Finding.info(
                "no_management",
                "management API",
                "no management URL: policies, feature flags and plugins not checked",
            )
        )
        findings += await probe_declared(connection, topology)
        findings += legacy.findings(await legacy.probe(connection, topology))
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
        # Needs the `monitoring` tag; without it, the nodes that hold a replica stand in.
        nodes_read = await api.get("/api/nodes")
        nodes: list[dict[str, Any]] = nodes_read.json() if nodes_read.is_success else []
    findings = queue_conflicts(topology, {q["name"]: q for q in queues})
    running = [str(node["name"]) for node in nodes if node.get("running", True)] or [
        str(member) for queue in queues for member in queue.get("members") or ()
    ]
    findings += placement_findings(topology, queues, running)
    if unreadable:
        findings.append(
            Finding.warning(
                "management_forbidden",
                "management API",
                f"this user may not read {', '.join(unreadable)}: not checked",
            )
        )
    findings += exchange_conflicts(topology, {e["name"]: str(e.get("type")) for e in exchanges})
    findings += legacy.findings(legacy.from_management(topology, queues, exchanges))
    findings += policy_findings(topology, version, policies, operator)
    types = {str(item.get("name")) for item in overview.get("exchange_types", [])}
    if "x-consistent-hash" not in types:
        findings.append(consistent_hash_missing(topology))
    states = {str(flag.get("name")): str(flag.get("state")) for flag in flags}
    if states.get("stream_queue", "enabled") != "enabled":
        findings.append(
            Finding.error(
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
        return Finding.error(
            "consistent_hash_missing",
            "plugins",
            "rabbitmq_consistent_hash_exchange is not enabled, and sharded bands need it "
            f"({', '.join(sharded)}): enable it",
        )
    return Finding.warning(
        "consistent_hash_missing",
        "plugins",
        "rabbitmq_consistent_hash_exchange is not enabled: bands cannot be sharded "
        "(`shards`) on this broker",
    )


__all__ = ["band_ordering", "check_broker", "consistent_hash_missing", "log_report"]

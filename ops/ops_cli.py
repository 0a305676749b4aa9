"""Operator commands: `bandgate dlq list | replay | purge` (`ops.dlq_cli`), `bandgate stats`,
`bandgate doctor`.

`register(root)` mounts them on the root CLI; `app` runs them alone (and in tests). What they
share (settings, one-line failures, printing) is `ops.ops_support`.
"""

from __future__ import annotations

import httpx
import orjson
import typer
from aio_pika.abc import AbstractConnection
from rich.markup import escape
from rich.table import Table

from bandgate.core.queue_stats import BandStats, QueueStats, collect_queue_stats
from bandgate.ops.dlq_cli import dlq_app
from bandgate.ops.ops_support import (
    JsonOption,
    QueueArgument,
    age_text,
    broker_settings,
    cell_text,
    console,
    fail,
    run,
)
from bandgate.ops.topology_cli import AmqpUrlOption, ManagementUrlOption, TopologyOption
from bandgate.topology import naming
from bandgate.topology.broker_report import BrokerReport
from bandgate.topology.doctor import check_broker
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Topology
from bandgate.topology.settings import BrokerSettings, redact


def _management(settings: BrokerSettings) -> ManagementClient | None:
    if not settings.management_url:
        return None
    return ManagementClient(settings.management_url, vhost_of(settings.amqp_url))


def _band_queues(band: BandStats) -> str:
    shards = band["shards"]
    if not shards:
        return band["queue"]
    return f"{shards[0]['queue']} .. {shards[-1]['queue']} ({len(shards)} shards)"


def _priority_counts(counts: dict[str, int] | None) -> str:
    if counts is None:
        return "-"
    return " ".join(f"{priority}:{count}" for priority, count in counts.items()) or "0"


def stats(
    queue: QueueArgument,
    as_json: JsonOption = False,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Show QUEUE's bands: ready, unacked, consumers, the head's age; delayed and dead letters."""
    settings = broker_settings(topology, amqp_url, management_url)
    management = _management(settings)

    async def work(connection: AbstractConnection, model: Topology) -> QueueStats:
        return await collect_queue_stats(connection, model, model.queue(queue), management)

    figures = run(settings, work)
    if as_json:
        typer.echo(orjson.dumps(figures))
        return
    table = Table(title=escape(f"{queue} at {redact(settings.amqp_url)}"), title_justify="left")
    for column in ("Band", "Priorities", "RabbitMQ queue"):
        table.add_column(column)
    for column in ("Ready", "Unacked", "Consumers", "Oldest ready"):
        table.add_column(column, justify="right")
    by_priority = any(band["ready_by_priority"] is not None for band in figures["bands"])
    if by_priority:  # RabbitMQ 4.3 counts a quorum queue's ready messages per priority
        table.add_column("Ready by priority")
    for band in figures["bands"]:
        low, high = band["priorities"]
        table.add_row(
            escape(band["band"]),
            str(low) if low == high else f"{low}-{high}",
            escape(_band_queues(band)),
            cell_text(band["ready"]),
            cell_text(band["unacked"]),
            cell_text(band["consumers"]),
            age_text(band["oldest_ready_age_seconds"]),
            *([_priority_counts(band["ready_by_priority"])] if by_priority else []),
        )
    out = console()
    out.print(table)
    out.print(
        f"ready {figures['ready']}, delayed {figures['delayed']} (all queues: the delay ladder "
        f"is shared), dead-lettered {cell_text(figures['dead_lettered'])} in "
        f"{naming.dead_letter_queue(queue)}",
        markup=False,
        soft_wrap=True,
    )
    if management is None:
        out.print(
            "unacked and the oldest message's age need --management-url "
            "(or BANDGATE_MANAGEMENT_URL)",
            markup=False,
            soft_wrap=True,
        )


def doctor(
    as_json: JsonOption = False,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Check the broker: version, in-band order, and settings that would lose or loop
    messages. Exits 1 when there is an error."""
    settings = broker_settings(topology, amqp_url, management_url)

    async def work(connection: AbstractConnection, model: Topology) -> BrokerReport:
        return await check_broker(
            connection, model, settings.management_url, vhost_of(settings.amqp_url)
        )

    try:
        report = run(settings, work)
    except httpx.HTTPError as exc:  # check_broker turns these into findings; belt and braces
        fail(f"management API at {redact(str(settings.management_url))}: {exc}")
    if as_json:
        typer.echo(orjson.dumps(report.to_json()))
    else:
        _print_report(report)
    if not report.ok:
        raise typer.Exit(code=1)


def _print_report(report: BrokerReport) -> None:
    out = console()
    out.print(report.summary(), markup=False, soft_wrap=True)
    if report.capabilities:
        out.print(f"capabilities: {', '.join(report.capabilities)}", markup=False, soft_wrap=True)
    table = Table(title="Order inside each band", title_justify="left")
    for column in ("RabbitMQ queue", "Type", "Order", "Why"):
        table.add_column(column, overflow="fold")
    for item in report.ordering:
        table.add_row(
            escape(item.rabbitmq_queue), item.queue_type, item.ordering, escape(item.detail)
        )
    out.print(table)
    out.print("Across bands: waterfall, hottest band first (the consumer library).", markup=False)
    if not report.findings:
        out.print("No problems found.", markup=False)
    styles = {"error": "bold red", "warning": "yellow", "info": "dim"}
    for finding in report.findings:
        out.print(
            f"[{styles[finding.severity]}]{finding.severity.upper()}[/] {escape(str(finding))}",
            soft_wrap=True,
        )
    errors, warnings = len(report.errors), len(report.warnings)
    out.print(f"{errors} error(s), {warnings} warning(s).", markup=False)


def register(root: typer.Typer) -> None:
    """Mount `dlq`, `stats` and `doctor` on the root CLI."""
    root.add_typer(dlq_app, name="dlq")
    root.command()(stats)
    root.command()(doctor)


app = typer.Typer(
    help="bandgate operator commands.", no_args_is_help=True, pretty_exceptions_show_locals=False
)
register(app)

__all__ = ["app", "doctor", "register", "stats"]

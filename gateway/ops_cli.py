"""Operator commands: `bandgate dlq list | replay | purge`, `bandgate stats`, `bandgate doctor`.

`register(root)` mounts them on the root CLI; `app` runs them alone (and in tests). Settings come
from `BANDGATE_*` variables, overridden by --amqp-url, --management-url and --topology.
Expected failures print one line to stderr and exit 1: no traceback, no password.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NoReturn, TypeVar

import aiormq
import httpx
import orjson
import typer
from aio_pika.abc import AbstractConnection
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from gateway.dead_letters import (
    DeadLetter,
    DeadLetterError,
    ReplayProgress,
    ReplayResult,
    count_dead_letters,
    list_dead_letters,
    purge,
    replay,
)
from gateway.stats import BandStats, QueueStats, StatsError, collect_queue_stats
from topology import naming
from topology.cli import (
    AmqpUrlOption,
    CliFailure,
    ManagementUrlOption,
    TopologyOption,
    connect,
    duration,
    reason,
    redact,
)
from topology.declare import broker_version, parse_version
from topology.doctor import BrokerReport, check_broker
from topology.loader import TopologyError
from topology.management import ManagementClient, vhost_of
from topology.model import Topology, UnknownQueueError
from topology.settings import BrokerSettings

T = TypeVar("T")

QueueArgument = Annotated[str, typer.Argument(help="The logical queue, e.g. orders.")]
ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason", help="Only dead letters whose cause, reason or error type contains this."
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

dlq_app = typer.Typer(
    help="List, replay or purge a queue's dead letters.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals would print the AMQP URL's password
)


def _fail(message: str) -> NoReturn:
    Console(stderr=True, highlight=False).print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code=1)


def _out() -> Console:
    return Console(highlight=False)


def _settings(
    topology: TopologyOption, amqp_url: AmqpUrlOption, management_url: ManagementUrlOption
) -> BrokerSettings:
    overrides: dict[str, Any] = {
        "topology": topology,
        "amqp_url": amqp_url,
        "management_url": management_url,
    }
    try:
        return BrokerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        _fail(f"invalid settings: {exc}")


def _run(
    settings: BrokerSettings, work: Callable[[AbstractConnection, Topology], Awaitable[T]]
) -> T:
    """Load the topology, connect, run `work`; every expected failure becomes one line."""
    try:
        topology = settings.load_topology()
        return asyncio.run(_connected(settings, topology, work))
    except (CliFailure, TopologyError, DeadLetterError, StatsError) as exc:
        _fail(str(exc))
    except UnknownQueueError as exc:
        _fail(f"{exc}: the topology in {settings.topology} does not define it")
    except (aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError) as exc:
        _fail(f"RabbitMQ at {redact(settings.amqp_url)} failed: {reason(exc)}")


async def _connected(
    settings: BrokerSettings,
    topology: Topology,
    work: Callable[[AbstractConnection, Topology], Awaitable[T]],
) -> T:
    async with await connect(settings) as connection:
        return await work(connection, topology)


def _management(settings: BrokerSettings) -> ManagementClient | None:
    if not settings.management_url:
        return None
    return ManagementClient(settings.management_url, vhost_of(settings.amqp_url))


def _band_queues(band: BandStats) -> str:
    shards = band["shards"]
    if not shards:
        return band["queue"]
    return f"{shards[0]['queue']} .. {shards[-1]['queue']} ({len(shards)} shards)"


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds)


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


@dlq_app.command("list")
def list_command(
    queue: QueueArgument,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Show at most this many.")] = 20,
    reason: ReasonOption = None,
    as_json: JsonOption = False,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Show the oldest dead letters of QUEUE; they stay in the dead-letter queue, in order."""
    settings = _settings(topology, amqp_url, management_url)

    async def work(
        connection: AbstractConnection, model: Topology
    ) -> tuple[str, int, list[DeadLetter]]:
        total = await count_dead_letters(connection, model, queue)
        records = await list_dead_letters(connection, model, queue, limit=limit, reason=reason)
        return broker_version(connection), total, records

    version, total, records = _run(settings, work)
    if (4, 0) <= parse_version(version) < (4, 3):
        Console(stderr=True, highlight=False).print(
            f"warning: RabbitMQ {version} counts each listing as a delivery of every dead "
            f"letter; under a delivery limit (20 unless a policy says otherwise) a dead letter "
            "listed that often is dropped: see `bandgate doctor`",
            markup=False,
            soft_wrap=True,
        )
    if as_json:
        typer.echo(orjson.dumps({"total": total, "dead_letters": [r.to_json() for r in records]}))
        return
    dlq = naming.dead_letter_queue(queue)
    out = _out()
    if not records:
        what = f"matching {reason!r} " if reason else ""
        out.print(f"No dead letters {what}in {dlq} ({total} in all).", markup=False)
        return
    filtered = f" matching {reason!r}" if reason else ""
    title = escape(f"{dlq}: {len(records)} of {total} dead letters{filtered}, oldest first")
    table = Table(title=title, title_justify="left")
    for column in ("Message id", "Cause", "Reason", "Attempts", "Band", "Priority", "Dead for"):
        table.add_column(column, overflow="fold")
    for record in records:
        table.add_row(
            escape(record.message_id),
            escape(_cell(record.cause)),
            escape(_cell(record.reason)),
            _cell(record.attempts),
            escape(_cell(record.original_band)),
            _cell(record.priority),
            _age(record.age_seconds),
        )
    out.print(table)


@dlq_app.command("replay")
def replay_command(
    queue: QueueArgument,
    reason: ReasonOption = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Replay at most this many.")
    ] = None,
    rate: Annotated[
        float | None, typer.Option("--rate", min=0.001, help="At most this many per second.")
    ] = None,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Republish dead letters of QUEUE to their original bands, each acked from the
    dead-letter queue only once the broker confirmed its copy."""
    settings = _settings(topology, amqp_url, management_url)
    dlq = naming.dead_letter_queue(queue)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("replayed {task.fields[replayed]}, skipped {task.fields[skipped]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True, highlight=False),
    )
    task: TaskID | None = None

    def report(state: ReplayProgress) -> None:
        nonlocal task
        if task is None:
            task = progress.add_task(f"Replaying {dlq}", total=state.total, replayed=0, skipped=0)
        progress.update(
            task, completed=state.examined, replayed=state.replayed, skipped=state.skipped
        )

    async def work(connection: AbstractConnection, model: Topology) -> ReplayResult:
        return await replay(
            connection, model, queue, limit=limit, reason=reason, rate=rate, progress=report
        )

    with progress:
        result = _run(settings, work)
    out = _out()
    out.print(
        f"Replayed {result.replayed} of {result.examined} examined dead letters from {dlq} "
        f"to their bands; {result.skipped} did not match, {len(result.kept)} kept.",
        markup=False,
        soft_wrap=True,
    )
    for line in result.kept:
        out.print(f"  kept {line}", markup=False, soft_wrap=True)
    if result.error:
        _fail(f"{result.error}; the rest stay in {dlq}")


@dlq_app.command("purge")
def purge_command(
    queue: QueueArgument,
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm: the dead letters are deleted for good.")
    ] = False,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Delete every dead letter of QUEUE (needs --yes)."""
    dlq = naming.dead_letter_queue(queue)
    if not yes:
        _fail(f"purge deletes every message in {dlq} for good; add --yes to confirm")
    settings = _settings(topology, amqp_url, management_url)

    async def work(connection: AbstractConnection, model: Topology) -> int:
        return await purge(connection, model, queue)

    count = _run(settings, work)
    _out().print(f"Purged {count} dead letters from {dlq}.", markup=False)


def stats(
    queue: QueueArgument,
    as_json: JsonOption = False,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Show QUEUE's bands: ready, unacked, consumers, the head's age; delayed and dead letters."""
    settings = _settings(topology, amqp_url, management_url)
    management = _management(settings)

    async def work(connection: AbstractConnection, model: Topology) -> QueueStats:
        return await collect_queue_stats(connection, model, model.queue(queue), management)

    figures = _run(settings, work)
    if as_json:
        typer.echo(orjson.dumps(figures))
        return
    table = Table(title=escape(f"{queue} at {redact(settings.amqp_url)}"), title_justify="left")
    for column in ("Band", "Priorities", "RabbitMQ queue"):
        table.add_column(column)
    for column in ("Ready", "Unacked", "Consumers", "Oldest ready"):
        table.add_column(column, justify="right")
    for band in figures["bands"]:
        low, high = band["priorities"]
        table.add_row(
            escape(band["band"]),
            str(low) if low == high else f"{low}-{high}",
            escape(_band_queues(band)),
            _cell(band["ready"]),
            _cell(band["unacked"]),
            _cell(band["consumers"]),
            _age(band["oldest_ready_age_seconds"]),
        )
    out = _out()
    out.print(table)
    out.print(
        f"ready {figures['ready']}, delayed {figures['delayed']} (all queues: the delay ladder "
        f"is shared), dead-lettered {_cell(figures['dead_lettered'])} in "
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
    settings = _settings(topology, amqp_url, management_url)

    async def work(connection: AbstractConnection, model: Topology) -> BrokerReport:
        return await check_broker(
            connection, model, settings.management_url, vhost_of(settings.amqp_url)
        )

    try:
        report = _run(settings, work)
    except httpx.HTTPError as exc:  # check_broker turns these into findings; belt and braces
        _fail(f"management API at {redact(str(settings.management_url))}: {exc}")
    if as_json:
        typer.echo(orjson.dumps(report.to_json()))
    else:
        _print_report(report)
    if not report.ok:
        raise typer.Exit(code=1)


def _print_report(report: BrokerReport) -> None:
    out = _out()
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

__all__ = ["app", "dlq_app", "doctor", "register", "stats"]

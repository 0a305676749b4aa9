"""`bandgate dlq list | replay | purge`: a queue's dead letters from the command line.

`gateway.ops_cli` mounts `dlq_app` on the root CLI; the work is `gateway.dead_letters`.
"""

from __future__ import annotations

from typing import Annotated

import orjson
import typer
from aio_pika.abc import AbstractConnection
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

from gateway.dead_letter_records import DeadLetter
from gateway.dead_letters import (
    ReplayProgress,
    ReplayResult,
    count_dead_letters,
    list_dead_letters,
    purge,
    replay,
)
from gateway.ops_support import (
    JsonOption,
    QueueArgument,
    age_text,
    broker_settings,
    cell_text,
    console,
    fail,
    run,
)
from topology import naming
from topology.cli import AmqpUrlOption, ManagementUrlOption, TopologyOption
from topology.declare import broker_version, parse_version
from topology.model import Topology

ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason", help="Only dead letters whose cause, reason or error type contains this."
    ),
]

dlq_app = typer.Typer(
    help="List, replay or purge a queue's dead letters.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals would print the AMQP URL's password
)


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
    settings = broker_settings(topology, amqp_url, management_url)

    async def work(
        connection: AbstractConnection, model: Topology
    ) -> tuple[str, int, list[DeadLetter]]:
        total = await count_dead_letters(connection, model, queue)
        records = await list_dead_letters(connection, model, queue, limit=limit, reason=reason)
        return broker_version(connection), total, records

    version, total, records = run(settings, work)
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
    out = console()
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
            escape(cell_text(record.cause)),
            escape(cell_text(record.reason)),
            cell_text(record.attempts),
            escape(cell_text(record.original_band)),
            cell_text(record.priority),
            age_text(record.age_seconds),
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
    settings = broker_settings(topology, amqp_url, management_url)
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
        result = run(settings, work)
    out = console()
    out.print(
        f"Replayed {result.replayed} of {result.examined} examined dead letters from {dlq} "
        f"to their bands; {result.skipped} did not match, {len(result.kept)} kept.",
        markup=False,
        soft_wrap=True,
    )
    for line in result.kept:
        out.print(f"  kept {line}", markup=False, soft_wrap=True)
    if result.error:
        fail(f"{result.error}; the rest stay in {dlq}")


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
        fail(f"purge deletes every message in {dlq} for good; add --yes to confirm")
    settings = broker_settings(topology, amqp_url, management_url)

    async def work(connection: AbstractConnection, model: Topology) -> int:
        return await purge(connection, model, queue)

    count = run(settings, work)
    console().print(f"Purged {count} dead letters from {dlq}.", markup=False)


__all__ = ["dlq_app"]

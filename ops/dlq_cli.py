"""`bandgate dlq list | replay | purge`: a queue's dead letters from the command line.

`ops.ops_cli` mounts `dlq_app` on the root CLI; the work is `core.dead_letters`, with
its bounds (checked here as option ranges) and its lock: while another list, replay or purge
of the queue runs, a command waits up to 10 s, then fails with one line saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import orjson
import typer
from aio_pika.abc import AbstractConnection
from rich import box
from rich.console import Console, Group
from rich.padding import Padding
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from bandgate.core.dead_letter_records import DeadLetter
from bandgate.core.dead_letters import (
    MAX_LIST,
    MAX_RATE,
    MAX_REASON,
    MAX_REPLAY,
    MIN_RATE,
    DeadLetterList,
    ReplayProgress,
    ReplayResult,
    purge,
    read_dead_letters,
    replay,
)
from bandgate.core.dlq_access import LOCK_WAIT_SECONDS, MAX_LOCK_WAIT
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
from bandgate.topology.declare import broker_version, parse_version
from bandgate.topology.model import Topology


def _reason(value: str | None) -> str | None:
    if value is not None and len(value) > MAX_REASON:
        raise typer.BadParameter(f"at most {MAX_REASON} characters")
    return value


ReasonOption = Annotated[
    str | None,
    typer.Option(
        "--reason",
        help="Only dead letters whose cause, reason or error type contains this.",
        callback=_reason,
    ),
]

WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        max=MAX_LOCK_WAIT,
        help="Seconds to wait while another list, replay or purge of the queue runs.",
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
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=MAX_LIST, help="Show at most this many.")
    ] = 20,
    reason: ReasonOption = None,
    as_json: JsonOption = False,
    wait: WaitOption = LOCK_WAIT_SECONDS,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Show the oldest dead letters of QUEUE; they stay in the dead-letter queue, in order."""
    settings = broker_settings(topology, amqp_url, management_url)

    async def work(connection: AbstractConnection, model: Topology) -> tuple[str, DeadLetterList]:
        listing = await read_dead_letters(
            connection, model, queue, limit=limit, reason=reason, lock_wait=wait
        )
        return broker_version(connection), listing

    version, listing = run(settings, work)
    total, records = listing.total, listing.records
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
    title = f"{dlq}: {len(records)} of {total} dead letters{filtered}, oldest first"
    out.print(dead_letter_table(records, title))


def dead_letter_table(records: Sequence[DeadLetter], title: str) -> Table:
    """One dead letter per row, readable at 80 columns: the id whole on its line (a UUID is
    36 characters; folded, it took four lines), its cause and reason folded under it, and the
    short columns never wrapped."""
    table = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    table.add_column("Message id\n  cause: reason")
    table.add_column("Attempts", justify="right", no_wrap=True)
    table.add_column("Band", no_wrap=True)
    table.add_column("Priority", justify="right", no_wrap=True)
    table.add_column("Dead for", no_wrap=True)
    for record in records:
        why = ": ".join(part for part in (record.cause, record.reason) if part) or "-"
        table.add_row(
            Group(
                Text(record.message_id, overflow="fold"),  # one word: its width is kept
                Padding(Text(why, style="dim", overflow="fold"), (0, 0, 0, 2)),
            ),
            cell_text(record.attempts),
            Text(cell_text(record.original_band)),  # Text: never read as markup
            cell_text(record.priority),
            age_text(record.age_seconds),
        )
    return table


@dlq_app.command("replay")
def replay_command(
    queue: QueueArgument,
    reason: ReasonOption = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=MAX_REPLAY, help="Replay at most this many."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", min=MIN_RATE, max=MAX_RATE, help="At most this many per second."),
    ] = None,
    wait: WaitOption = LOCK_WAIT_SECONDS,
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
            connection,
            model,
            queue,
            limit=limit,
            reason=reason,
            rate=rate,
            progress=report,
            lock_wait=wait,
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
    wait: WaitOption = LOCK_WAIT_SECONDS,
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
        return await purge(connection, model, queue, lock_wait=wait)

    count = run(settings, work)
    console().print(f"Purged {count} dead letters from {dlq}.", markup=False)


__all__ = ["dead_letter_table", "dlq_app"]

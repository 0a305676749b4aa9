"""`bandgate topology apply | export | show | prune`: put the topology on a broker, write it as
definitions.json, print it, or remove what an older bandgate left on the broker.

Mounted by the root CLI (`gateway/cli.py`) as the `topology` group; usable alone as `app`.
Expected failures (an invalid topology file, an unreachable broker, a conflicting queue) print
one clear message to stderr and exit 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import aiormq
import httpx
import typer
from aio_pika.abc import AbstractConnection
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bandgate.core import cluster_connection
from bandgate.topology import legacy, naming
from bandgate.topology.declare import ApplyReport, apply_topology
from bandgate.topology.export import DEV_PASSWORD, DEV_USER, definitions, to_json
from bandgate.topology.loader import TopologyError
from bandgate.topology.management import ManagementClient, vhost_of
from bandgate.topology.model import Band, QueueSpec, RetryPolicy, Topology
from bandgate.topology.settings import BrokerSettings, redact

CONNECT_TIMEOUT_SECONDS = 10.0

app = typer.Typer(
    help="Apply the topology to RabbitMQ, export it as definitions.json, show it, or prune "
    "what an older version left.",
    no_args_is_help=True,
    # A traceback's locals would print the AMQP URL, password included.
    pretty_exceptions_show_locals=False,
)

TopologyOption = Annotated[
    Path | None,
    typer.Option(
        "--topology",
        help="Topology TOML file (default: $BANDGATE_TOPOLOGY, else ./bandgate.toml).",
        show_default=False,
    ),
]
AmqpUrlOption = Annotated[
    str | None,
    typer.Option(
        "--amqp-url",
        help="AMQP URL of the broker, vhost included (default: $BANDGATE_AMQP_URL).",
        show_default=False,
    ),
]
ManagementUrlOption = Annotated[
    str | None,
    typer.Option(
        "--management-url",
        help="Management API URL; with it, a conflict lists every differing argument "
        "(default: $BANDGATE_MANAGEMENT_URL).",
        show_default=False,
    ),
]


class CliFailure(Exception):
    """An expected failure, already phrased for the operator."""


def _stdout() -> Console:
    # Created per command, not at import: Console reads COLUMNS/NO_COLOR when it is built.
    return Console(highlight=False)


def _fail(message: str) -> NoReturn:
    Console(stderr=True, highlight=False).print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code=1)


def _settings(topology: Path | None, amqp_url: str | None = None, **more: Any) -> BrokerSettings:
    overrides = {"topology": topology, "amqp_url": amqp_url, **more}
    try:
        return BrokerSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        _fail(f"invalid settings: {exc}")


def _load(settings: BrokerSettings) -> Topology:
    try:
        return settings.load_topology()
    except TopologyError as exc:
        _fail(str(exc))


# aiormq logs a failed connect at ERROR before raising; the CLI reports it once, itself.
_AIORMQ_CONNECTION_LOG = "aiormq.connection"


@contextmanager
def quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def connect(settings: BrokerSettings) -> AbstractConnection:
    """Open the CLI's connection; every way that fails becomes one `CliFailure` line that
    names the broker and the setting that chose it."""
    where = settings.describe_broker()
    if not settings.chosen:
        # Nobody chose this broker: say which one is asked, lest another one answers unnoticed.
        Console(stderr=True, highlight=False).print(
            f"using RabbitMQ at {where}", markup=False, soft_wrap=True, style="dim"
        )
    try:
        with quiet(_AIORMQ_CONNECTION_LOG):
            return await cluster_connection.connect(
                settings.amqp_url,
                client_properties={"connection_name": naming.CLI_CONNECTION},
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
            )
    except aiormq.exceptions.InvalidFrameError:
        # aiormq reports a Connection.Close during the handshake only as a frame's repr; on
        # an accepted login that means the vhost is missing or not permitted for this user.
        raise CliFailure(
            f"RabbitMQ at {where} closed the connection while opening it: does the vhost "
            f"{vhost_of(settings.amqp_url)!r} exist, and may this user use it?"
        ) from None
    except (aiormq.exceptions.AMQPError, OSError, TimeoutError) as exc:
        raise CliFailure(f"cannot connect to RabbitMQ at {where}: {reason(exc)}") from None


async def _apply(settings: BrokerSettings, topology: Topology) -> ApplyReport:
    where = redact(settings.amqp_url)
    connection = await connect(settings)
    management = None
    if settings.management_url:
        management = ManagementClient(settings.management_url, vhost_of(settings.amqp_url))
    async with connection:
        try:
            return await apply_topology(connection, topology, management)
        except aiormq.exceptions.AMQPError as exc:
            raise CliFailure(f"RabbitMQ at {where} refused the topology: {reason(exc)}") from None
        except httpx.HTTPError as exc:
            # Only asked after a conflict, for its details.
            raise CliFailure(
                f"the topology conflicts with a queue on {where}, and the management API at "
                f"{redact(str(settings.management_url))} could not say how: {exc}; run without "
                "--management-url to see the first difference"
            ) from None


def reason(exc: BaseException) -> str:
    text = " ".join(str(arg) for arg in exc.args if arg)
    return text or type(exc).__name__


@app.command()
def apply(
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
    management_url: ManagementUrlOption = None,
) -> None:
    """Declare every exchange, queue and binding of the topology; safe to run again."""
    settings = _settings(topology, amqp_url, management_url=management_url)
    model = _load(settings)
    try:
        report = asyncio.run(_apply(settings, model))
    except (CliFailure, TopologyError) as exc:
        _fail(str(exc))
    bands = sum(len(spec.bands) for spec in model.queues.values())
    out = _stdout()
    out.print(
        f"Applied {settings.topology} to RabbitMQ {report.broker_version} at "
        f"{redact(settings.amqp_url)}",
        markup=False,
        soft_wrap=True,
    )
    out.print(
        f"  {report.exchanges} exchanges, {report.queues} queues, {report.bindings} bindings: "
        f"{len(model.queues)} logical queues in {bands} bands, "
        f"{model.ladder.levels} delay levels",
        markup=False,
        soft_wrap=True,
    )


@app.command()
def prune(
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Remove them even while they hold delayed messages (which are then lost) or "
            "workers of the older version consume them.",
        ),
    ] = False,
    topology: TopologyOption = None,
    amqp_url: AmqpUrlOption = None,
) -> None:
    """Remove the objects an older bandgate named otherwise (its delay ladder, workers queues);
    refuses while they are in use."""
    settings = _settings(topology, amqp_url)
    model = _load(settings)
    try:
        removed = asyncio.run(_prune(settings, model, force))
    except (CliFailure, TopologyError) as exc:
        _fail(str(exc))
    names = [queue.name for queue in removed.queues] + list(removed.exchanges)
    _stdout().print(
        f"Removed {len(removed.queues)} queues and {len(removed.exchanges)} exchanges of an "
        f"older bandgate: {', '.join(names)}"
        if removed
        else f"Nothing to prune at {redact(settings.amqp_url)}",
        markup=False,
        soft_wrap=True,
    )


async def _prune(settings: BrokerSettings, topology: Topology, force: bool) -> legacy.Leftovers:
    connection = await connect(settings)
    async with connection:
        try:
            return await legacy.prune(connection, topology, force)
        except aiormq.exceptions.AMQPError as exc:
            where = redact(settings.amqp_url)
            raise CliFailure(f"RabbitMQ at {where} refused the removal: {reason(exc)}") from None


@app.command()
def export(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here instead of printing to stdout."),
    ] = None,
    vhost: Annotated[str, typer.Option("--vhost", help="Virtual host of every object.")] = "/",
    dev_user: Annotated[
        bool,
        typer.Option(
            "--dev-user",
            help=f"Add the development login {DEV_USER}/{DEV_PASSWORD} (administrator): "
            "a broker that loads definitions at boot creates no default "
            "user. For docker-compose only; never import it into a shared broker.",
        ),
    ] = False,
    topology: TopologyOption = None,
) -> None:
    """Print or write the topology as a RabbitMQ definitions.json."""
    model = _load(_settings(topology))
    document = definitions(model, vhost, dev_user=dev_user)
    text = to_json(document)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        _fail(f"cannot write {output}: {exc}")
    Console(stderr=True, highlight=False).print(
        f"Wrote {output}: {len(document['exchanges'])} exchanges, {len(document['queues'])} "
        f"queues, {len(document['bindings'])} bindings in vhost {vhost!r}",
        markup=False,
        soft_wrap=True,
    )


@app.command()
def show(topology: TopologyOption = None) -> None:
    """Print the queues, their bands and RabbitMQ queues, and the delay ladder."""
    settings = _settings(topology)
    model = _load(settings)
    title = escape(f"{settings.topology}: exchange {model.exchange!r}")  # a path may hold '['
    table = Table(title=title, title_justify="left")
    for column in ("Queue", "Band", "Priorities", "RabbitMQ queue", "Type", "Aging", "Retry"):
        table.add_column(column, overflow="fold")
    for spec in model.queues.values():
        for index, band in enumerate(spec.bands):
            table.add_row(
                spec.name if index == 0 else "",
                band.name,
                _priorities(band),
                _band_queues(spec, band),
                _band_type(band),
                _aging(spec, band),
                (_retry(spec.name, spec.retry) + _ordering(spec)) if index == 0 else "",
                end_section=index == len(spec.bands) - 1,
            )
    out = _stdout()
    out.print(table)
    for line in _routing_summary(model):
        out.print(line, markup=False, soft_wrap=True)


def _priorities(band: Band) -> str:
    return str(band.low) if band.low == band.high else f"{band.low}-{band.high}"


def _band_queues(spec: QueueSpec, band: Band) -> str:
    queues = spec.band_queues(band)
    if len(queues) == 1:
        return queues[0]
    return f"{queues[0]} .. {queues[-1]} ({len(queues)} shards)"


def _ordering(spec: QueueSpec) -> str:
    if spec.ordering_required:
        return f"; strictly serial, failures: {spec.effective_failure_strategy}"
    if spec.ordered:
        return f"; ordered per partition key, failures: {spec.effective_failure_strategy}"
    return ""


def _band_type(band: Band) -> str:
    if band.type == "classic":
        return f"classic, x-max-priority {band.high}"
    return band.type


def _aging(spec: QueueSpec, band: Band) -> str:
    above = spec.band_above(band)
    if band.age_after_seconds is None or above is None:
        return "-"
    return f"after {duration(band.age_after_seconds)} to {above.name}"


def _retry(queue: str, retry: RetryPolicy) -> str:
    backoff = f"{duration(retry.backoff_initial_seconds)}"
    if retry.backoff_multiplier != 1:
        backoff += f" x{retry.backoff_multiplier:g} up to {duration(retry.backoff_max_seconds)}"
    return (
        f"{retry.max_attempts} attempts, back-off {backoff}, then {naming.dead_letter_queue(queue)}"
    )


def _routing_summary(model: Topology) -> list[str]:
    ladder = model.ladder
    top = ladder.levels - 1
    return [
        f"Publish: exchange {model.exchange!r} (topic), routing key <queue>.<priority>; "
        f"dead letters: {naming.dead_letter_exchange(model.exchange)!r} -> <queue>.dlq",
        f"Delay ladder: {ladder.levels} levels, {naming.delay_level(model.exchange, 0)} "
        f"({duration(ladder.ttl_ms(0) / 1000)}) to {naming.delay_level(model.exchange, top)} "
        f"({duration(ladder.ttl_ms(top) / 1000)}); delays up to "
        f"{duration(ladder.max_delay_ms / 1000)} in {duration(ladder.base_ms / 1000)} steps",
        f"  one queue hop per 1-bit of the delay (at most {ladder.levels}); due messages leave "
        f"through {naming.delay_exit_exchange(model.exchange)!r} to their band",
    ]


def duration(seconds: float) -> str:
    """A duration the way an operator says it: 50 ms, 1.5 s, 10 min, 4.86 days, 13.6 years."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    for threshold, size, unit in _DURATION_UNITS:
        if seconds >= threshold:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


# (from, unit size, name): switch units at 2 of them, so 90 s stays "90 s", not "1.5 min".
_DURATION_UNITS = (
    (365 * 86400, 365 * 86400, "years"),
    (2 * 86400, 86400, "days"),
    (2 * 3600, 3600, "h"),
    (120, 60, "min"),
)

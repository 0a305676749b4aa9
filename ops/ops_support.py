"""What the operator commands (`ops.dlq_cli`, `ops.ops_cli`) share: settings from their
options, running against the broker, and printing.

Settings come from `BANDGATE_*` variables, overridden by --amqp-url, --management-url and
--topology. Expected failures print one line to stderr and exit 1: no traceback, no password.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, NoReturn, TypeVar

import aiormq
import typer
from aio_pika.abc import AbstractConnection
from pydantic import ValidationError
from rich.console import Console

from bandgate.core.dlq_access import DeadLetterError
from bandgate.core.queue_stats import StatsError
from bandgate.ops.topology_cli import (
    AmqpUrlOption,
    CliFailure,
    ManagementUrlOption,
    TopologyOption,
    connect,
    duration,
    reason,
)
from bandgate.topology.loader import TopologyError
from bandgate.topology.model import Topology, UnknownQueueError
from bandgate.topology.settings import BrokerSettings

T = TypeVar("T")

QueueArgument = Annotated[str, typer.Argument(help="The logical queue, e.g. orders.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def fail(message: str) -> NoReturn:
    Console(stderr=True, highlight=False).print(f"error: {message}", markup=False, soft_wrap=True)
    raise typer.Exit(code=1)


def console() -> Console:
    return Console(highlight=False)


def broker_settings(
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
        fail(f"invalid settings: {exc}")


def run(
    settings: BrokerSettings, work: Callable[[AbstractConnection, Topology], Awaitable[T]]
) -> T:
    """Load the topology, connect, run `work`; every expected failure becomes one line."""
    try:
        topology = settings.load_topology()
        return asyncio.run(_connected(settings, topology, work))
    except (CliFailure, TopologyError) as exc:
        fail(str(exc))
    except (DeadLetterError, StatsError) as exc:
        fail(f"{exc} (RabbitMQ at {settings.describe_broker()})")
    except UnknownQueueError as exc:
        fail(f"{exc}: the topology in {settings.topology} does not define it")
    except (aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError) as exc:
        fail(f"RabbitMQ at {settings.describe_broker()} failed: {reason(exc)}")


async def _connected(
    settings: BrokerSettings,
    topology: Topology,
    work: Callable[[AbstractConnection, Topology], Awaitable[T]],
) -> T:
    async with await connect(settings) as connection:
        return await work(connection, topology)


def age_text(seconds: float | None) -> str:
    return "-" if seconds is None else duration(seconds)


def cell_text(value: object) -> str:
    return "-" if value is None else str(value)


__all__ = [
    "JsonOption",
    "QueueArgument",
    "age_text",
    "broker_settings",
    "cell_text",
    "console",
    "fail",
    "run",
]

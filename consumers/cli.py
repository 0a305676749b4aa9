"""`bandgate worker module:app`: load an app by name and run its worker.

`worker` is a plain function with typer parameters, registered by `gateway/cli.py` as the
`bandgate worker` command; `python -m bandgate.consumers` runs it on its own.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Annotated

import typer

from bandgate.consumers.app import ConsumerApp
from bandgate.consumers.errors import ConsumerError
from bandgate.consumers.worker import Worker, run_on_event_loop
from bandgate.topology.loader import TopologyError

log = logging.getLogger(__name__)


class AppNotFound(ConsumerError):
    """The `module:app` target names no importable ConsumerApp."""


def load_app(target: str) -> ConsumerApp:
    """Import `module:attribute` (`module` alone means `module:app`) as a ConsumerApp.

    The current directory is importable, as with `python -m`, so `bandgate worker tasks:app`
    finds ./tasks.py.
    """
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "app"
    if not module_name or not all(part.isidentifier() for part in attribute.split(".")):
        raise AppNotFound(f"{target!r} is not of the form module:attribute (e.g. tasks:app)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AppNotFound(f"cannot import module {module_name!r}: {exc}") from None
        raise  # the module exists; something it imports is missing: show where
    found: object = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise AppNotFound(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, ConsumerApp):
        raise AppNotFound(
            f"{module_name}:{attribute} is a {type(found).__name__}, not a ConsumerApp"
        )
    return found


def worker(
    target: Annotated[
        str, typer.Argument(help="the app to run, as module:attribute (e.g. myproject.tasks:app)")
    ],
    concurrency: Annotated[
        int | None,
        typer.Option(
            "--concurrency", "-c", min=1, help="handlers at once per consumer (overrides the code)"
        ),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(
            "--grace",
            min=0,
            help="seconds running handlers get to finish on SIGTERM "
            "(default: BANDGATE_SHUTDOWN_GRACE_SECONDS, else 30)",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="serve Prometheus /metrics on this port (default: BANDGATE_METRICS_PORT, else "
            "none)",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug, info, warning or error")
    ] = "info",
) -> None:
    """Run the consumers of a ConsumerApp until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        app = load_app(target)
    except (AppNotFound, ConsumerError, TopologyError) as exc:
        typer.echo(f"bandgate worker: {exc}", err=True)
        raise typer.Exit(2) from None
    if not app.consumers:
        typer.echo(f"bandgate worker: {target} has no consumers (@app.consumer)", err=True)
        raise typer.Exit(2)
    settings = app.settings
    overrides: dict[str, object] = {}
    if grace is not None:
        overrides["shutdown_grace_seconds"] = grace
    if metrics_port is not None:
        overrides["metrics_port"] = metrics_port
    if settings.fast_frames is None:
        overrides["fast_frames"] = True  # this process runs nothing but the worker
    if overrides:
        settings = settings.model_copy(update=overrides)
    try:
        worker = Worker(app, concurrency=concurrency, settings=settings)
        run_on_event_loop(worker.serve(), settings.event_loop)
    except (ConsumerError, TopologyError) as exc:
        typer.echo(f"bandgate worker: {exc}", err=True)
        raise typer.Exit(1) from None


def main() -> None:
    typer.run(worker)

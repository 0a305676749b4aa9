"""The `bandgate` command line."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer
import uvicorn

from bandgate.consumers.cli import worker
from bandgate.ops.message_cli import register as register_messages
from bandgate.ops.ops_cli import register as register_ops
from bandgate.ops.receive_cli import register as register_receive
from bandgate.ops.topology_cli import app as topology_app

root = typer.Typer(
    help="bandgate: a priority-band gateway over RabbitMQ.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals would print the AMQP URL's password
)
root.add_typer(topology_app, name="topology")
register_ops(root)
register_receive(root)
register_messages(root)
root.command("worker")(worker)


@root.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="bind address [BANDGATE_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [BANDGATE_PORT]")] = None,
    workers: Annotated[int | None, typer.Option(help="processes [BANDGATE_WORKERS]")] = None,
) -> None:
    """Serve the HTTP gateway (configuration from BANDGATE_* variables)."""
    from bandgate.gateway.http_server import server_options
    from bandgate.gateway.settings import GatewaySettings

    for name, value in (("HOST", host), ("PORT", port), ("WORKERS", workers)):
        if value is not None:
            os.environ[f"BANDGATE_{name}"] = str(value)  # worker processes read it too
    # This process is the gateway's alone, as a worker's is (`bandgate worker`): its HTTP
    # receivers read deliveries with bandgate's frame decoder (`PullSettings.fast_frames`).
    os.environ.setdefault("BANDGATE_PULL_FAST_FRAMES", "true")
    settings = GatewaySettings()
    uvicorn.run(
        "bandgate.pull.app:create_app",
        factory=True,
        workers=settings.workers,
        **server_options(settings),
    )


@root.command()
def dev(
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="gateway port", envvar="BANDGATE_PORT")] = 8000,
) -> None:
    """Run everything locally: a private RabbitMQ node, the topology and the gateway.

    With BANDGATE_AMQP_URL set, that broker is used and no node is started. Where the broker
    and the gateway are goes to .bandgate/dev.json, for the other commands run here.
    """
    from bandgate.ops.dev import run_dev

    run_dev(host, port)


@root.command()
def token(
    name: Annotated[str, typer.Option(help="who uses it, e.g. orders-api")],
    scope: Annotated[
        list[str],
        typer.Option(help="publish:<queue>, read:<queue>, consume:<queue> (queue or *), or admin"),
    ],
) -> None:
    """Make a new API token: prints the secret once, and the entry for BANDGATE_TOKENS."""
    import json

    from pydantic import ValidationError

    from bandgate.gateway.auth import TokenSpec, hash_token, new_token

    secret = new_token()
    try:
        spec = TokenSpec(name=name, sha256=hash_token(secret), scopes=tuple(scope))
    except ValidationError as exc:
        typer.echo(f"error: {exc.errors()[0]['msg'].removeprefix('Value error, ')}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"token (shown once, give it to {name}): {secret}")
    typer.echo("entry for BANDGATE_TOKENS (a JSON list of these):")
    typer.echo(json.dumps(spec.model_dump(exclude_none=True)))


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per management API call
    root()


__all__ = ["main", "root"]

"""`bandgate receive | ack | release | extend`: an HTTP pull consumer for shell scripts.

They talk to a gateway's receive API (`bandgate.pull.routes`) over HTTP, as any client would,
so a script needs a URL and a token, not the broker. `receive` prints each message, receipt
included, as one JSON line on stdout and nothing else there; `release` and `extend` print the
API's answer as one JSON line; `ack` prints nothing. Failures print `error: <code>: <message>`
on stderr and exit 2 when the request was refused (4xx, or a bad option) and 1 when the
gateway failed or could not be reached (5xx, connection), so a script can tell "fix the call"
from "try again".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn
from urllib.parse import quote

import httpx
import orjson
import typer

from bandgate.pull.settings import MAX_MESSAGES, MAX_VISIBILITY_SECONDS, MAX_WAIT_SECONDS
from bandgate.topology.dev_record import find_record
from bandgate.topology.settings import redact

DEFAULT_GATEWAY = "http://127.0.0.1:8000"
REQUEST_TIMEOUT = 30.0
# After an empty answer to a receive that did not wait, a loop pauses this long rather than
# asking the gateway again at once.
EMPTY_PAUSE = 1.0


class GatewayError(Exception):
    """A request that failed: the API's error code and message, and the exit status it means."""

    def __init__(self, code: str, message: str, exit_code: int) -> None:
        super().__init__(f"{code}: {message}")
        self.exit_code = exit_code


def _positive(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise typer.BadParameter("must be more than 0")
    return value


QueueArgument = Annotated[str, typer.Argument(help="The logical queue, e.g. orders.")]
ReceiptArgument = Annotated[str, typer.Argument(help="A receipt from `bandgate receive`.")]
GatewayOption = Annotated[
    str | None,
    typer.Option(
        "--gateway",
        envvar="BANDGATE_GATEWAY_URL",
        show_default=False,
        help="The gateway's URL (default: the one `bandgate dev` recorded here, else "
        f"{DEFAULT_GATEWAY}).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="BANDGATE_TOKEN", show_default=False, help="API token (consume:QUEUE)."
    ),
]


def gateway_url(given: str | None) -> str:
    """The gateway: `--gateway` or BANDGATE_GATEWAY_URL, else the one `bandgate dev`
    (`make run`) recorded in .bandgate/dev.json here or above, else the default address."""
    if given:
        return given
    found = find_record()
    return found[1].gateway_url if found else DEFAULT_GATEWAY


@contextmanager
def gateway_client(gateway: str | None, token: str | None) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    base = gateway_url(gateway)
    with httpx.Client(base_url=base, headers=headers, timeout=REQUEST_TIMEOUT) as client:
        yield client


def queue_path(queue: str, tail: str) -> str:
    return f"/v1/queues/{quote(queue, safe='')}/{tail}"


def call_gateway(
    client: httpx.Client, method: str, path: str, body: Any = None, timeout: float = REQUEST_TIMEOUT
) -> Any:
    """The answer's JSON (None for 204), or a `GatewayError`."""
    try:
        response = client.request(method, path, json=body, timeout=timeout)
    except httpx.HTTPError as exc:
        where = redact(str(client.base_url))
        raise GatewayError("unreachable", f"gateway at {where}: {exc!r}", 1) from None
    if response.status_code == 204:
        return None
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.is_success:
        return data
    exit_code = 2 if response.status_code < 500 else 1
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        raise GatewayError(str(error.get("code")), str(error.get("message")), exit_code)
    raise GatewayError(f"http_{response.status_code}", response.text[:200], exit_code)


def fail(error: GatewayError) -> NoReturn:
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(error.exit_code)


def print_json(data: Any) -> None:
    typer.echo(orjson.dumps(data).decode())  # click flushes: a pipe sees each line at once


def receive(
    queue: QueueArgument,
    gateway: GatewayOption = None,
    token: TokenOption = None,
    max_messages: Annotated[
        int, typer.Option("--max", min=1, max=MAX_MESSAGES, help="Messages per receive call.")
    ] = 1,
    wait: Annotated[
        float,
        typer.Option(min=0, max=MAX_WAIT_SECONDS, help="Seconds a receive waits for a message."),
    ] = MAX_WAIT_SECONDS,
    visibility: Annotated[
        float | None,
        typer.Option(
            max=MAX_VISIBILITY_SECONDS,
            callback=_positive,
            show_default=False,
            help="Seconds the messages stay leased (default: the gateway's).",
        ),
    ] = None,
    ack: Annotated[
        bool, typer.Option("--ack", help="Ack each message once printed: take it for good.")
    ] = False,
    count: Annotated[
        int | None,
        typer.Option(min=1, show_default=False, help="Stop after this many messages."),
    ] = None,
    forever: Annotated[bool, typer.Option("--forever", help="Keep receiving.")] = False,
) -> None:
    """Receive messages of QUEUE: one JSON line each on stdout, receipt included.

    Without --count or --forever, one receive call (which may return nothing), then exit.
    """
    if count is not None and forever:
        raise typer.BadParameter("give --count or --forever, not both", param_hint="--count")
    body: dict[str, Any] = {"wait_seconds": wait}
    if visibility is not None:
        body["visibility_timeout"] = visibility
    printed = 0
    try:
        with gateway_client(gateway, token) as client:
            while True:
                wanted = max_messages if count is None else min(max_messages, count - printed)
                answer = call_gateway(
                    client,
                    "POST",
                    queue_path(queue, "receive"),
                    {**body, "max_messages": wanted},
                    timeout=wait + REQUEST_TIMEOUT,
                )
                messages: list[dict[str, Any]] = answer["messages"]
                for message in messages:
                    print_json(message)
                    if ack:
                        receipt = quote(message["receipt"], safe="")
                        call_gateway(client, "DELETE", queue_path(queue, f"receipts/{receipt}"))
                printed += len(messages)
                if not forever and (count is None or printed >= count):
                    return
                if not messages and wait < EMPTY_PAUSE:
                    time.sleep(EMPTY_PAUSE - wait)
    except GatewayError as error:
        fail(error)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def ack(
    queue: QueueArgument,
    receipts: Annotated[list[str], typer.Argument(help="Receipts from `bandgate receive`.")],
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Ack messages of QUEUE by receipt: they are done and gone.

    Every receipt is tried and each failure is one line on stderr; the exit is 1 when any
    failure may pass on a retry (5xx, connection), else 2 when any receipt was refused.
    """
    failures: list[int] = []
    with gateway_client(gateway, token) as client:
        for receipt in receipts:
            try:
                call_gateway(
                    client, "DELETE", queue_path(queue, f"receipts/{quote(receipt, safe='')}")
                )
            except GatewayError as error:
                typer.echo(f"error: {receipt}: {error}", err=True)
                failures.append(error.exit_code)
    if failures:
        raise typer.Exit(min(failures))


def release(
    queue: QueueArgument,
    receipt: ReceiptArgument,
    delay: Annotated[
        float | None,
        typer.Option(min=0, show_default=False, help="Retry no sooner than this many seconds."),
    ] = None,
    reason: Annotated[
        str | None, typer.Option(show_default=False, help="Why: kept with the message.")
    ] = None,
    dead_letter: Annotated[
        bool, typer.Option("--dead-letter", help="Never retry: to the dead-letter queue.")
    ] = False,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Give a message of QUEUE back: retried later (counted as an attempt), or dead-lettered.

    Prints the outcome as one JSON line.
    """
    body: dict[str, Any] = {"receipt": receipt, "dead_letter": dead_letter}
    if delay is not None:
        body["delay_seconds"] = delay
    if reason is not None:
        body["reason"] = reason
    with gateway_client(gateway, token) as client:
        try:
            print_json(call_gateway(client, "POST", queue_path(queue, "receipts/release"), body))
        except GatewayError as error:
            fail(error)


def extend(
    queue: QueueArgument,
    receipt: ReceiptArgument,
    visibility: Annotated[
        float,
        typer.Option(
            min=0, max=MAX_VISIBILITY_SECONDS, help="Seconds from now the message stays leased."
        ),
    ],
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Keep a message of QUEUE leased for longer. Prints the new `visible_until` as JSON."""
    body = {"receipt": receipt, "visibility_timeout": visibility}
    with gateway_client(gateway, token) as client:
        try:
            print_json(call_gateway(client, "POST", queue_path(queue, "receipts/extend"), body))
        except GatewayError as error:
            fail(error)


def register(root: typer.Typer) -> None:
    """Mount `receive`, `ack`, `release` and `extend` on the root CLI."""
    for command in (receive, ack, release, extend):
        root.command()(command)


__all__ = [
    "GatewayError",
    "ack",
    "call_gateway",
    "extend",
    "fail",
    "gateway_client",
    "gateway_url",
    "print_json",
    "queue_path",
    "receive",
    "register",
    "release",
]

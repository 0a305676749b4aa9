"""`bandgate cancel | replace | escalate`: act on a pending message by id from a shell.

They call the gateway's message routes (`bandgate.gateway.message_routes`) over HTTP, as any
client would, with a URL and a token that may publish to the queue. Each prints the API's
answer as one JSON line; the gateway decides what is valid (a priority or a band, not both),
so the CLI holds no second copy of those rules. Failures print `error: <code>: <message>` on
stderr and exit as `bandgate receive` does: 2 when the request was refused (4xx, or a bad
option), 1 when the gateway failed or could not be reached (5xx, connection), so a script can
tell "fix the call" from "try again". A `tombstone_not_written` answer (503) exits 1: the new
generation was published, and repeating the command is safe.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import orjson
import typer

from bandgate.ops.receive_cli import (
    GatewayError,
    GatewayOption,
    QueueArgument,
    call_gateway,
    fail,
    gateway_client,
    print_json,
    queue_path,
)

MessageIdArgument = Annotated[
    str, typer.Argument(help="The id the message was published with (its message_id).")
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token", envvar="BANDGATE_TOKEN", show_default=False, help="API token (publish:QUEUE)."
    ),
]


def _json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}") from None


def _headers(pairs: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--header")
        headers[name] = value
    return headers


def _priority(text: str | None) -> int | str | None:
    """A number as a number, else the name (`high`): the gateway knows both."""
    if text is None:
        return None
    return int(text) if text.lstrip("-").isdigit() else text


PayloadOption = Annotated[
    Any,
    typer.Option(
        parser=_json, metavar="JSON", help="The message's payload, as JSON (sent again in full)."
    ),
]
PriorityOption = Annotated[
    str | None,
    typer.Option(
        show_default=False, help="0-9 or critical, high, normal, low, background (default 4)."
    ),
]
DelayOption = Annotated[
    float | None,
    typer.Option("--delay", min=0, show_default=False, help="Deliver after this many seconds."),
]
HeaderOption = Annotated[
    list[str] | None,
    typer.Option("--header", metavar="NAME=VALUE", help="A header (string value); repeatable."),
]


def _message_path(queue: str, message_id: str, tail: str = "") -> str:
    return queue_path(queue, f"messages/{quote(message_id, safe='')}{tail}")


def _send(gateway: str | None, token: str | None, method: str, path: str, body: Any = None) -> None:
    with gateway_client(gateway, token) as client:
        try:
            print_json(call_gateway(client, method, path, body))
        except GatewayError as error:
            fail(error)


def _body(
    payload: Any, priority: str | None, delay: float | None, header: list[str] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"payload": payload}
    if priority is not None:
        body["priority"] = _priority(priority)
    if delay is not None:
        body["delay_seconds"] = delay
    if header:
        body["headers"] = _headers(header)
    return body


def cancel(
    queue: QueueArgument,
    message_id: MessageIdArgument,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel a pending message of QUEUE: consumers skip the copies published before now.

    The ledger cannot tell an id never published, or already handled, from a pending one.
    """
    _send(gateway, token, "DELETE", _message_path(queue, message_id))


def replace(
    queue: QueueArgument,
    message_id: MessageIdArgument,
    payload: PayloadOption,
    priority: PriorityOption = None,
    delay: DelayOption = None,
    header: HeaderOption = None,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Replace a pending message of QUEUE: publish this one, and skip the older copies."""
    body = _body(payload, priority, delay, header)
    _send(gateway, token, "PUT", _message_path(queue, message_id), body)


def escalate(
    queue: QueueArgument,
    message_id: MessageIdArgument,
    payload: PayloadOption,
    priority: PriorityOption = None,
    band: Annotated[
        str | None,
        typer.Option(show_default=False, help="A band of QUEUE: its highest priority."),
    ] = None,
    delay: DelayOption = None,
    header: HeaderOption = None,
    gateway: GatewayOption = None,
    token: TokenOption = None,
) -> None:
    """Send a pending message of QUEUE again, hotter (--priority or --band); skip the older.

    A message cannot be taken out of its band, so its payload is sent again in full.
    """
    body = _body(payload, priority, delay, header)
    if band is not None:
        body["band"] = band
    _send(gateway, token, "POST", _message_path(queue, message_id, "/escalate"), body)


def register(root: typer.Typer) -> None:
    """Mount `cancel`, `replace` and `escalate` on the root CLI."""
    for command in (cancel, replace, escalate):
        root.command()(command)


__all__ = ["cancel", "escalate", "register", "replace"]

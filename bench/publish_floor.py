"""The floor under the gateway's single-message publish (issue 35): what uvicorn and the
publishing core cost with none of the gateway's own layers.

An ASGI app, run by plain uvicorn (httptools, uvloop) as `bench publish` runs the gateway, that
reads the bench's publish body, builds its envelope by the input rules every publish follows
(`publish_input.envelope_for`), publishes it through the gateway's `Publisher` on the same
confirm channels (`BrokerLink`), and answers 201 with the gateway's body. No auth, rate limit,
schema, guards, Starlette, metrics or head limits: those are what the gateway adds above it.
With `BANDGATE_BENCH_FLOOR_PUBLISH=false` it answers without publishing, which leaves the
server, the JSON and the input rules alone.

Not a server to deploy: it checks nothing a client sends beyond what the rules check.
"""

from __future__ import annotations

import os
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from bandgate.core.broker import BrokerLink
from bandgate.core.publishing import Published
from bandgate.gateway.routes import published_body
from bandgate.topology.loader import load_topology
from bandgate.topology.publish_input import envelope_for

PUBLISH = os.environ.get("BANDGATE_BENCH_FLOOR_PUBLISH", "true") != "false"
QUEUE = "orders"
_HEAD = [(b"content-type", b"application/json")]

_topology = load_topology()
_spec = _topology.queue(QUEUE)
_link: BrokerLink | None = None


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["method"] == "GET":  # readiness: the lifespan has connected
        await _answer(send, 200, b"{}")
        return
    body = await _body(receive)
    data: dict[str, Any] = orjson.loads(body)
    envelope = envelope_for(_topology, _spec, data["payload"], priority=data.get("priority"))
    if PUBLISH:
        assert _link is not None
        result = await _link.publisher.publish(envelope)
    else:
        result = Published(
            message_id=envelope.message_id,
            queue=envelope.queue,
            band=_spec.band_for(envelope.priority).name,
            priority=envelope.priority,
            enqueued_at=envelope.enqueued_at,
            deliver_at=None,
        )
    await _answer(send, 201, orjson.dumps(published_body(result)))


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [*_HEAD, (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message: Message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(parts)


async def _lifespan(receive: Receive, send: Send) -> None:
    global _link
    await receive()  # startup
    if PUBLISH:
        _link = BrokerLink(os.environ["BANDGATE_AMQP_URL"], _topology, declare_topology=False)
        await _link.start(wait=30)
    await send({"type": "lifespan.startup.complete"})
    await receive()  # shutdown
    if _link is not None:
        await _link.close()
    await send({"type": "lifespan.shutdown.complete"})

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
from starlette.types import Scope

from bandgate.core.broker import BrokerLink
from bandgate.core.publishing import Published
from bandgate.gateway.routes import published_body
from bandgate.topology.loader import load_topology
from bandgate.topology.publish_input import envelope_for
from bench.bare_asgi import floor_app

PUBLISH = os.environ.get("BANDGATE_BENCH_FLOOR_PUBLISH", "true") != "false"
QUEUE = "orders"

_topology = load_topology()
_spec = _topology.queue(QUEUE)
_link: BrokerLink | None = None


async def _publish(scope: Scope, data: Any) -> tuple[int, bytes]:
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
    return 201, orjson.dumps(published_body(result))


async def _start() -> None:
    global _link
    if PUBLISH:
        _link = BrokerLink(os.environ["BANDGATE_AMQP_URL"], _topology, declare_topology=False)
        await _link.start(wait=30)


async def _stop() -> None:
    if _link is not None:
        await _link.close()


app = floor_app(_publish, _start, _stop)

"""An example worker: run it with `bandgate worker examples.worker:app`.

Settings come from the environment: BANDGATE_AMQP_URL (default: the broker `make run` started
here), BANDGATE_TOPOLOGY (default ./bandgate.toml, which defines `orders` and `emails`),
BANDGATE_SHUTDOWN_GRACE_SECONDS, ...; EXAMPLE_STOCK (default 100) is this example's own.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from bandgate.consumers import ConsumerApp, Message, Reject, Retry

log = logging.getLogger(__name__)

app = ConsumerApp()


class OutOfStock(Exception):
    """The warehouse cannot fill the order yet: an ordinary exception, so the worker retries
    it with exponential back-off and dead-letters it after the queue's max_attempts."""


@app.consumer("orders", concurrency=8, time_limit=30)
async def process_order(msg: Message) -> None:
    """Orders, hot before warm before cold; async, so eight run at once on the event loop."""
    order = msg.payload
    if not isinstance(order, dict) or "order_id" not in order:
        raise Reject("an order needs an order_id")  # no retry can fix it: straight to the DLQ
    if order.get("stock") == "recounting":
        raise Retry(delay=30)  # the count is being redone: look again in 30 s
    await reserve_stock(order)
    log.info(
        "order %s reserved (priority %d, band %s, attempt %d)",
        order["order_id"],
        msg.priority,
        msg.band,
        msg.attempt,
    )


async def reserve_stock(order: dict[str, Any]) -> None:
    await asyncio.sleep(0)  # stands in for a database call
    # The README's dead-letter walk-through restocks by restarting with EXAMPLE_STOCK=1000.
    stock = int(os.environ.get("EXAMPLE_STOCK", "100"))
    if order.get("quantity", 1) > stock:
        raise OutOfStock(
            f"only {stock} in stock, order {order['order_id']} wants {order['quantity']}"
        )


@app.consumer("emails", concurrency=4, policy="weighted")
def send_email(msg: Message) -> None:
    """A plain function: the worker runs it in one of its four threads. `weighted` keeps the
    cold band (newsletters) moving while password resets keep coming."""
    email = msg.payload
    if "to" not in email:
        raise Reject("an e-mail needs a recipient")
    log.info("sending %r to %s", email.get("subject", ""), email["to"])  # stands in for SMTP

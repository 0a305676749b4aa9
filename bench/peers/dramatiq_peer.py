"""Dramatiq on RabbitMQ: "Dramatiq max_priority" (see `dramatiq_app` for the settings).

One queue declared by `RabbitmqBroker(max_priority=9)`, backlog messages at `broker_priority`
1, hot ones at 8 (higher is more urgent, unlike an actor's `priority`). The backlog is
published through Dramatiq's own client (`send_with_options`, no confirms, its default), then
counted on the broker. Dramatiq's queues are classic queues: not replicated, unlike bandgate's
bands (quorum queues).
"""

from __future__ import annotations

import asyncio

from bench.peers.base import Peer, PeerConfig, wait_for_depth
from bench.stage import delete, depths


class DramatiqPeer(Peer):
    name = "Dramatiq max_priority"
    needs = ("dramatiq", "pika")

    def config(self) -> PeerConfig:
        return PeerConfig(
            kind="dramatiq", url=self.broker.amqp_url, concurrency=self.scenario.concurrency
        )

    def _queues(self) -> tuple[str, ...]:
        from bench.peers import dramatiq_app

        # The queue, and Dramatiq's delay (DQ) and dead-letter (XQ) queues beside it.
        return tuple(f"{dramatiq_app.QUEUE}{suffix}" for suffix in ("", ".DQ", ".XQ"))

    def setup(self) -> None:
        from bench.peers import dramatiq_app

        dramatiq_app.declare(self.config())
        asyncio.run(depths(self.broker.amqp_url, (), self._queues()))  # emptied

    def top_up(self) -> None:
        from bench.peers import dramatiq_app

        queue = dramatiq_app.QUEUE
        (depth,) = asyncio.run(depths(self.broker.amqp_url, (queue,)))
        count = self.scenario.backlog - depth
        if count > 0:
            dramatiq_app.publish_backlog(self.config(), self.scenario.payload, count)
        wait_for_depth(self.broker.amqp_url, queue, self.scenario.backlog)

    def tear_down(self) -> None:
        asyncio.run(delete(self.broker.amqp_url, self._queues()))

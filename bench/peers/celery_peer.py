"""Celery on RabbitMQ, two ways (see `celery_app` for the settings, and why):

- "Celery x-max-priority": one queue with `x-max-priority`, backlog tasks at priority 1, hot
  ones at 8 (higher is more urgent with AMQP);
- "Celery -Q hot,warm,cold": three queues, one worker consuming all three, backlog tasks in
  the cold one, hot ones in the hot one.

The backlog is published through Celery's own client (`apply_async` on one producer, no
confirms, as Celery publishes by default), then counted on the broker. Celery's queues are
classic queues: not replicated, unlike bandgate's bands (quorum queues).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

from bench.peers.base import Peer, PeerConfig, wait_for_depth
from bench.stage import delete, depths


class CeleryPeer(Peer):
    needs = ("celery", "kombu")
    variant: ClassVar[str]

    def config(self) -> PeerConfig:
        return PeerConfig(
            kind=f"celery-{self.variant}",
            url=self.broker.amqp_url,
            concurrency=self.scenario.concurrency,
            options={"variant": self.variant},
        )

    def _names(self) -> tuple[str, tuple[str, ...]]:
        """The queue holding the backlog, and the others."""
        from bench.peers import celery_app

        if self.variant == "priority":
            return celery_app.PRIORITY_QUEUE, ()
        hot, warm, cold = (celery_app.band_queue(band) for band in celery_app.BANDS)
        return cold, (hot, warm)

    def setup(self) -> None:
        from bench.peers import celery_app

        app = celery_app.make_app(self.config())
        try:
            with app.connection_for_write() as connection:
                channel = connection.default_channel
                for queue in app.amqp.queues.values():  # as the worker declares them
                    queue.bind(channel).declare()
                    queue.bind(channel).purge()
        finally:
            app.close()

    def top_up(self) -> None:
        from bench.peers import celery_app

        backlog, others = self._names()
        (depth,) = asyncio.run(depths(self.broker.amqp_url, (backlog,), others))
        count = self.scenario.backlog - depth
        if count > 0:
            celery_app.publish_backlog(self.config(), self.scenario.payload, count)
        wait_for_depth(self.broker.amqp_url, backlog, self.scenario.backlog)

    def tear_down(self) -> None:
        backlog, others = self._names()
        names = (backlog, *others)  # each with a direct exchange of its name
        asyncio.run(delete(self.broker.amqp_url, names, names))


class CeleryPriority(CeleryPeer):
    name = "Celery x-max-priority"
    variant = "priority"


class CeleryQueues(CeleryPeer):
    name = "Celery -Q hot,warm,cold"
    variant = "queues"

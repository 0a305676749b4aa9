"""The Dramatiq peer's broker and actor: `dramatiq bench.peers.dramatiq_app --processes 1
--threads 16`, and the publisher's client. Needs the `bench` extra.

`RabbitmqBroker(max_priority=9)` declares its queue with `x-max-priority`; a message's
`broker_priority` option is its AMQP priority, higher more urgent (the opposite of an actor's
own `priority`, which orders only the worker's in-process queue; both actors here are one
actor). The worker prefetches 2 x threads (32) messages, Dramatiq's default, into that
in-process queue, and acks each once its handler returns. Everything else is Dramatiq's
default (its middleware, no publisher confirms).

Dramatiq declares classic queues: not replicated, unlike bandgate's bands.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.peers.base import LockedRecorder, PeerConfig, config_from_env, exec_command, say

QUEUE = "bench_dramatiq"
ACTOR = "bench_handle"
MAX_PRIORITY = 9
HOT, COLD = 8, 1  # `broker_priority`: higher is more urgent


def make_broker(
    config: PeerConfig, recorder: LockedRecorder | None = None
) -> tuple[RabbitmqBroker, dramatiq.Actor[[dict[str, Any]], None]]:
    """The broker and its actor, recording into `recorder` (the worker's), sleeping
    `handler_ms`."""
    broker = RabbitmqBroker(url=config.url, max_priority=MAX_PRIORITY)
    dramatiq.set_broker(broker)
    pause = config.handler_ms / 1000

    def handle(payload: dict[str, Any]) -> None:
        if recorder is not None:
            recorder.record(payload)
        if pause:
            time.sleep(pause)

    actor = dramatiq.actor(queue_name=QUEUE, actor_name=ACTOR, broker=broker)(handle)
    return broker, actor


def serve(config: PeerConfig, out: str) -> None:
    """Become the Dramatiq worker, as its users start it."""
    argv = ["dramatiq", __name__, "--processes", "1", "--threads", str(config.concurrency)]
    exec_command(config, out, argv)


@contextmanager
def sender(config: PeerConfig) -> Iterator[Any]:
    """`send_with_options` of a hot message."""
    broker, actor = make_broker(config)

    def send(payload: dict[str, Any]) -> None:
        actor.send_with_options(args=(payload,), broker_priority=HOT)

    try:
        yield send
    finally:
        broker.close()


def declare(config: PeerConfig) -> None:
    """The queue (and the delay and dead-letter queues), as the worker declares them."""
    broker, _ = make_broker(config)
    try:
        broker.declare_queue(QUEUE, ensure=True)
    finally:
        broker.close()


def publish_backlog(config: PeerConfig, payload: dict[str, Any], count: int) -> None:
    """`count` backlog messages through Dramatiq's own client."""
    broker, actor = make_broker(config)
    try:
        for _ in range(count):
            actor.send_with_options(args=(payload,), broker_priority=COLD)
    finally:
        broker.close()


class _Hooks(dramatiq.Middleware):
    """Under `dramatiq` (started by `serve`): `ready` once the worker consumes, the record
    written once it has shut down (its handlers in hand finished)."""

    def __init__(self, recorder: LockedRecorder, out: str) -> None:
        self.recorder = recorder
        self.out = out

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        say("ready")

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.recorder.write(self.out)


def _worker_broker() -> RabbitmqBroker | None:
    found = config_from_env()
    if found is None:
        return None
    config, out = found
    recorder = LockedRecorder(config)
    made, _ = make_broker(config, recorder)
    made.add_middleware(_Hooks(recorder, out))
    return made


broker = _worker_broker()

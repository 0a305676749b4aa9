"""The Celery app both Celery peers run: `celery -A bench.peers.celery_app worker -P threads
-c 16`, its task, and the publisher's client. Needs the `bench` extra.

Set up as Celery's documentation says for RabbitMQ priorities ("Routing Tasks: RabbitMQ Message
Priorities", and "Optimizing: Prefetch Limits"): a queue with `x-max-priority` (10, with
`task_queue_max_priority` 10 and `task_default_priority` 5, as its example), and, so that the
broker rather than a buffer in the worker picks the most urgent task for a free thread,
`worker_prefetch_multiplier = 1` with `task_acks_late = True`. With AMQP a higher number is a
higher priority (with Redis it is the other way round). The `queues` variant declares three
plain queues instead and the worker consumes them all (`-Q hot,warm,cold`): each free thread
takes whatever the broker delivers next, from any of them. Everything else is Celery's
default: JSON, no result backend, no publisher confirms, mingle, gossip and heartbeats on.

Celery declares classic queues (a quorum queue needs `task_default_queue_type`): not
replicated, unlike bandgate's bands.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from celery.signals import worker_ready, worker_shutdown
from kombu import Exchange, Queue

from bench.peers.base import LockedRecorder, PeerConfig, config_from_env, exec_command, say

TASK = "bench.handle"
PRIORITY_QUEUE = "bench.celery.priority"
BANDS = ("hot", "warm", "cold")
MAX_PRIORITY = 10
HOT, COLD = 8, 1  # the priority variant's: higher is more urgent


def band_queue(band: str) -> str:
    return f"bench.celery.{band}"


def queues(variant: str) -> list[Queue]:
    """The queues of a variant (`priority` or `queues`), as the app and the worker declare them."""
    if variant == "priority":
        return [
            Queue(
                PRIORITY_QUEUE,
                Exchange(PRIORITY_QUEUE),
                routing_key=PRIORITY_QUEUE,
                queue_arguments={"x-max-priority": MAX_PRIORITY},
            )
        ]
    # What `-Q` makes of a queue name it does not know (`task_create_missing_queues`): a
    # direct exchange of that name, bound with that name.
    names = [band_queue(band) for band in BANDS]
    return [Queue(name, Exchange(name), routing_key=name) for name in names]


def make_app(config: PeerConfig, recorder: LockedRecorder | None = None) -> Celery:
    """The app, its task recording into `recorder` (the worker's) and sleeping `handler_ms`."""
    variant = config.options["variant"]
    app = Celery("bandgate_bench", broker=config.url, set_as_current=False)
    app.conf.update(
        task_queues=queues(variant),
        task_default_queue=PRIORITY_QUEUE if variant == "priority" else band_queue("cold"),
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,  # Celery 6's default; silences a warning
    )
    if variant == "priority":
        app.conf.task_queue_max_priority = MAX_PRIORITY
        app.conf.task_default_priority = 5
    pause = config.handler_ms / 1000

    @app.task(name=TASK, shared=False)  # this app's only: the bench makes one per use
    def handle(payload: dict[str, Any]) -> None:
        if recorder is not None:
            recorder.record(payload)
        if pause:
            time.sleep(pause)

    return app


def publish_options(config: PeerConfig, hot: bool) -> dict[str, Any]:
    """`apply_async` options of a hot or a backlog task."""
    if config.options["variant"] == "priority":
        return {"priority": HOT if hot else COLD}
    return {"queue": band_queue("hot" if hot else "cold")}


def serve(config: PeerConfig, out: str) -> None:
    """Become the Celery worker, as its users start it."""
    argv = ["celery", "-A", __name__, "worker", "-P", "threads", "-c", str(config.concurrency)]
    argv += ["--loglevel", "WARNING", "--hostname", f"bench-{config.options['variant']}@%h"]
    if config.options["variant"] == "queues":
        argv += ["-Q", ",".join(band_queue(band) for band in BANDS)]
    exec_command(config, out, argv)


@contextmanager
def sender(config: PeerConfig) -> Iterator[Any]:
    """`apply_async` of a hot task, on one producer connection."""
    app = make_app(config)
    task = app.tasks[TASK]
    options = publish_options(config, hot=True)
    with app.producer_or_acquire() as producer:

        def send(payload: dict[str, Any]) -> None:
            task.apply_async((payload,), producer=producer, **options)

        yield send
    app.close()


def publish_backlog(config: PeerConfig, payload: dict[str, Any], count: int) -> None:
    """`count` backlog tasks through Celery's own client, on one producer connection."""
    app = make_app(config)
    task = app.tasks[TASK]
    options = publish_options(config, hot=False)
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            task.apply_async((payload,), producer=producer, **options)
    app.close()


def _worker_hooks() -> Celery | None:
    """Under `celery worker` (started by `serve`): the app, recording; `ready` once it
    consumes, the record written once its warm shutdown is done."""
    found = config_from_env()
    if found is None:
        return None
    config, out = found
    recorder = LockedRecorder(config)

    def ready(**_: Any) -> None:
        say("ready")

    def shutdown(**_: Any) -> None:
        recorder.write(out)

    worker_ready.connect(ready, weak=False)
    worker_shutdown.connect(shutdown, weak=False)
    return make_app(config, recorder)


app = _worker_hooks()

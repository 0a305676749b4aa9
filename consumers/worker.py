"""The worker process: one connection, a runner per consumer, signals and a clean shutdown.

Shutdown (SIGTERM or SIGINT): cancel the band consumers so nothing new arrives, give back what
was buffered but not started, let running handlers finish for up to the grace period, then
cancel the rest (their messages go back to their bands) and close the channels and the
connection. A second signal skips the rest of the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIServer

import aio_pika
from aio_pika.abc import AbstractRobustConnection
from prometheus_client import start_http_server

from bandgate.consumers.consumer import Registry
from bandgate.consumers.decision import Tombstones
from bandgate.consumers.errors import ConsumerError
from bandgate.consumers.runner import ConsumerRunner, Timings
from bandgate.consumers.settings import EventLoopName, WorkerSettings
from bandgate.consumers.settlement import Settler
from bandgate.core import cluster_connection
from bandgate.core.heap import freeze_startup_heap
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.core.protocol import frames
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.core.telemetry import Telemetry
from bandgate.topology.declare import apply_topology, broker_version, counts_every_return
from bandgate.topology.doctor import check_broker, log_report
from bandgate.topology.management import vhost_of
from bandgate.topology.model import Topology

log = logging.getLogger(__name__)

CONNECT_RETRY_SECONDS = 1.0

T = TypeVar("T")


def run_until_stopped(worker: Worker) -> None:
    """`worker.serve()` on the event loop its settings name (`event_loop`), until a signal."""
    run_on_event_loop(worker.serve(), worker.settings.event_loop)


def run_on_event_loop(main: Coroutine[Any, Any, T], choice: EventLoopName = "auto") -> T:
    """`asyncio.run(main)`, on uvloop unless `choice` is asyncio (auto: when installed)."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                main.close()
                raise ConsumerError("event_loop is uvloop but uvloop is not installed") from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


class Worker:
    """Runs every consumer of an app; `run()` until `stop()`, `serve()` until a signal."""

    def __init__(
        self,
        app: Registry,
        *,
        concurrency: int | None = None,
        settings: WorkerSettings | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.app = app
        self.settings = settings or app.settings
        self.concurrency = concurrency or self.settings.concurrency
        self._own_telemetry = telemetry is None
        self.telemetry = telemetry or Telemetry(self.settings.connection_name)
        self.ready = asyncio.Event()
        self.stopped = asyncio.Event()
        self.runners: list[ConsumerRunner] = []
        self.ledger: LedgerFollower | None = None  # once started, unless not followed
        self._metrics_server: WSGIServer | None = None
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()

    def stop(self, *, hurry: bool = False) -> None:
        """Begin the shutdown; with `hurry`, do not wait for running handlers."""
        self._stop.set()
        if hurry:
            self._hurry.set()

    async def serve(self) -> None:
        """`run()` with SIGTERM and SIGINT wired to `stop()`."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for signum in signals:
            loop.add_signal_handler(signum, self._on_signal, signum)
        try:
            await self.run()
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stop.is_set():
            log.warning("%s again: not waiting for running handlers", name)
            self.stop(hurry=True)
        else:
            log.info(
                "%s: stopping (running handlers get %g s to finish)",
                name,
                self.settings.shutdown_grace_seconds,
            )
            self.stop()

    async def run(self) -> None:
        """Connect, consume until `stop()`, shut down; `ready` and `stopped` mark the way."""
        consumers = self.app.consumers
        if not consumers:
            raise ConsumerError("the app has no consumers: decorate a handler with @app.consumer")
        topology = self.app.topology
        if self.settings.fast_frames:
            frames.install()  # deliveries' frames read without pamqp's generic decoding
        self._serve_metrics()
        try:
            connection = await self._connect()
            try:
                await self._work(connection, topology)
            finally:
                await connection.close()
        finally:
            if self._metrics_server is not None:
                await asyncio.to_thread(self._metrics_server.shutdown)
                self._metrics_server.server_close()  # shutdown() leaves the socket open
            if self._own_telemetry:
                self.telemetry.shutdown()  # flushes spans still batched for OTLP
            self.stopped.set()
            log.info("worker stopped")

    async def _work(self, connection: AbstractRobustConnection, topology: Topology) -> None:
        channels = ChannelSet(confirm_channel_factory(connection))
        follower: LedgerFollower | None = None
        try:
            # The same broker check as the gateway: log the in-band order that applies, and
            # refuse to start on a configuration that would lose or loop messages.
            report = await check_broker(
                connection, topology, self.settings.management_url, vhost_of(self.settings.amqp_url)
            )
            log_report(report)
            report.raise_for_errors()
            if self.settings.declare_topology:
                await apply_topology(connection, topology)
            publisher = Publisher(
                topology, channels, self.settings.confirm_timeout_seconds, self.telemetry
            )
            settler = Settler(publisher)
            tombstones = None
            if self.settings.follow_ledger:
                follower = LedgerFollower(connection, topology, publisher, self.telemetry)
                await follower.start(self.settings.ledger_catchup_seconds)
                tombstones = Tombstones(follower)
            self.ledger = follower
            self.runners = [
                ConsumerRunner(
                    consumer,
                    connection,
                    settler,
                    concurrency=self.concurrency,
                    timings=Timings.of(self.settings),
                    telemetry=self.telemetry,
                    tombstones=tombstones,
                    # A graceful give-back (SIGTERM) is not a delivery: where the broker
                    # counts every return, give back uncounted copies instead.
                    hand_back=counts_every_return(broker_version(connection)),
                )
                for consumer in self.app.consumers
            ]
            loops: set[asyncio.Task[None]] = set()
            try:
                # Dispatch once every band is consumed and primed, so the first starts already
                # see all bands (strict order; weighted shares from the first message on).
                starting = asyncio.gather(*(runner.open() for runner in self.runners))
                await _first_of(starting, self._stop)
                if not self._stop.is_set():
                    loops = {asyncio.create_task(runner.run()) for runner in self.runners}
                    freeze_startup_heap()
                    self.ready.set()
                    log.info("worker ready: %d consumer(s)", len(self.runners))
                    stopped = asyncio.create_task(self._stop.wait())
                    done, _ = await asyncio.wait(
                        {stopped, *loops}, return_when=asyncio.FIRST_COMPLETED
                    )
                    stopped.cancel()
                    for loop in done & loops:
                        loop.result()  # a run loop only ends early on a bug: raise it
            finally:
                await self._shutdown()
                for loop in loops:
                    loop.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
        finally:
            if follower is not None:
                await follower.close()
            await channels.close()

    def _serve_metrics(self) -> None:
        port = self.settings.metrics_port
        if port is None:
            return
        self._metrics_server, _ = start_http_server(
            port, self.settings.metrics_host, self.telemetry.registry
        )
        log.info("metrics on http://%s:%d/metrics", self.settings.metrics_host, port)

    async def _connect(self) -> AbstractRobustConnection:
        """Connect, retrying while the broker is not up yet (a worker may start before it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.connect_timeout_seconds
        where = self.settings.describe_broker()
        log.info("connecting to RabbitMQ at %s", where)
        while True:
            try:
                return await cluster_connection.connect_robust(
                    self.settings.amqp_url,
                    client_properties={"connection_name": self.settings.connection_name},
                    reconnect_interval=self.settings.reconnect_interval_seconds,
                )
            except (ConnectionError, OSError, aio_pika.exceptions.AMQPConnectionError) as exc:
                if loop.time() + CONNECT_RETRY_SECONDS > deadline or self._stop.is_set():
                    raise ConsumerError(f"cannot connect to RabbitMQ at {where}: {exc}") from exc
                log.warning("cannot connect to RabbitMQ at %s yet (%s); retrying", where, exc)
                await _first_of(asyncio.sleep(CONNECT_RETRY_SECONDS), self._stop)

    async def _shutdown(self) -> None:
        for runner in self.runners:
            await runner.stop_consuming()
        pending: set[asyncio.Task[object]] = {
            task for runner in self.runners for task in runner.in_flight
        }
        if pending:
            log.info("waiting for %d running handler(s)", len(pending))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.settings.shutdown_grace_seconds
            hurry: asyncio.Task[object] = asyncio.create_task(self._hurry.wait())
            try:
                while pending and not self._hurry.is_set() and loop.time() < deadline:
                    _, pending = await asyncio.wait(
                        pending | {hurry},
                        timeout=deadline - loop.time(),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    pending.discard(hurry)
            finally:
                hurry.cancel()
            if pending:
                log.warning(
                    "cancelling %d handler(s) still running; their messages are returned",
                    len(pending),
                )
        for runner in self.runners:
            await runner.abort()
            await runner.close()


async def _first_of(awaitable: Awaitable[object], event: asyncio.Event) -> bool:
    """Await `awaitable` until it is done or `event` is set; True if it is done.

    When the event comes first, the awaitable is cancelled.
    """
    work = asyncio.ensure_future(awaitable)
    waiter = asyncio.create_task(event.wait())
    try:
        done, _ = await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if work in done:
        work.result()
        return True
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return False

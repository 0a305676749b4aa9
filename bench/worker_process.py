"""The consuming side of the consume, priority and memory benchmarks, in a process of its own.

`python -m bench.worker_process CONFIG OUT` (CONFIG: a `WorkerConfig` as JSON) runs one of:

- `bandgate`: the real consumer library as `bandgate worker` runs it (`ConsumerApp`,
  `@app.consumer`, `Worker.serve()`: waterfall dispatch, settling, telemetry, signals);
- `plain`: the baseline, a plain aio-pika consumer: one channel per queue with its prefetch,
  an `asyncio.Semaphore` of `concurrency` slots taken in arrival order, ack after the handler;
  on asyncio's own loop, as aio-pika runs by default (or on uvloop, for comparison).

Both run the same handler: record the message, then sleep `handler_ms` (nothing at 0). The
process prints `ready` once it consumes, stops after `expect` messages (0: on SIGTERM) and
writes what it recorded to OUT as JSON. `WorkerProcess` is the parent's handle on it.

The bandgate worker can also leave the tombstone ledger unfollowed (`follow_ledger`), dedupe
(`dedupe`: each handled id is recorded in the ledger), note when each message id started
(`record_ids`), and stop once `expect_settled` messages were settled, handled or skipped (the
ledger's skips never reach the handler). Its record then says what the worker's metrics counted
per outcome, and whether it followed the ledger with how many entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import aio_pika
import orjson

from bandgate.consumers.worker import Worker, run_on_event_loop
from bench.child import ChildProcess
from bench.environment import cpu_seconds, machine_busy_seconds

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Kind = Literal["bandgate", "plain"]


@dataclass
class WorkerConfig:
    kind: Kind
    amqp_url: str
    concurrency: int
    handler_ms: float = 0.0
    queue: str = "orders"  # bandgate: the logical queue
    prefetch: dict[str, int] | None = None  # bandgate: per band, instead of the defaults
    queues: list[tuple[str, int]] = field(default_factory=list)  # plain: (queue, prefetch)
    plain_loop: Literal["asyncio", "uvloop"] = "asyncio"  # plain: aio-pika's default, or uvloop
    expect: int = 0  # stop after this many messages; 0: run until SIGTERM
    warmup: int = 1  # the drain is timed from this message on
    run: str = ""  # hot messages of other runs count as background
    broker_pid: int | None = None  # to read the broker's CPU time at the first and last message
    gateway_pid: int | None = None  # and the gateway's, where one takes part
    follow_ledger: bool = True  # bandgate: follow the tombstone ledger
    ledger_catchup_seconds: float = 120.0  # bandgate: a long ledger takes a while to read
    dedupe: bool = False  # bandgate: the consumer dedupes by message id
    record_ids: bool = False  # bandgate: note when each message id started, and its priority
    expect_settled: int = 0  # bandgate: stop once this many were settled (skips included)
    hot_reserve: int = 0  # bandgate: slots the coldest band never takes


class Terms(Protocol):
    """What a `Recorder` needs of its process's config (`WorkerConfig`, `bench.pull_client`'s)."""

    run: str
    warmup: int
    expect: int
    broker_pid: int | None
    gateway_pid: int | None


class Recorder:
    """What the handler saw.

    Hot messages (payloads with `seq`, published by `bench.paced_publisher`) get their wait,
    handler start minus publish time; everything else counts as background, per wall-clock
    second. The `warmup`-th and the last message mark the drain time and the CPU spent in between.
    A hot message seen twice counts in `duplicates` (its first wait stays).
    """

    def __init__(self, config: Terms) -> None:
        self.config = config
        self.handled = 0
        self.duplicates = 0
        self.waits: dict[int, float] = {}
        self.background: Counter[int] = Counter()
        self.marks: dict[str, float] = {}
        self.ids: dict[str, list[tuple[float, int]]] = {}
        self.info: dict[str, Any] = {}
        self.on_done: Callable[[], None] = lambda: None

    def record(self, payload: Any) -> None:
        now = time.time()
        if isinstance(payload, dict) and "seq" in payload and payload.get("run") == self.config.run:
            seq = int(payload["seq"])
            if seq in self.waits:
                self.duplicates += 1
            else:
                self.waits[seq] = now - float(payload["t"])
        else:
            self.background[int(now)] += 1
        self.handled += 1
        if self.handled == self.config.warmup:
            self._mark("first")
        if self.handled == self.config.expect:
            self._mark("last")
            self.on_done()

    def record_id(self, message_id: str, priority: int) -> None:
        """When a copy of `message_id` started (wall clock, as other processes read it)."""
        self.ids.setdefault(message_id, []).append((time.time(), priority))

    def _mark(self, name: str) -> None:
        self.marks[f"{name}_at"] = time.perf_counter()
        self.marks[f"{name}_cpu"] = time.process_time()
        self.marks[f"{name}_broker_cpu"] = cpu_seconds(self.config.broker_pid)
        self.marks[f"{name}_machine_busy"] = machine_busy_seconds()
        if self.config.gateway_pid is not None:
            self.marks[f"{name}_gateway_cpu"] = cpu_seconds(self.config.gateway_pid)

    def result(self) -> dict[str, Any]:
        return {
            "handled": self.handled,
            "duplicates": self.duplicates,
            "waits": {str(seq): wait for seq, wait in self.waits.items()},
            "background": {str(second): n for second, n in self.background.items()},
            **self.marks,
            **({"ids": self.ids} if self.ids else {}),
            **self.info,
        }


async def run_bandgate(config: WorkerConfig, recorder: Recorder) -> None:
    from bandgate.consumers import ConsumerApp, Message
    from bandgate.consumers.settings import WorkerSettings

    settings = WorkerSettings(
        amqp_url=config.amqp_url,
        declare_topology=False,
        shutdown_grace_seconds=2.0,
        follow_ledger=config.follow_ledger,
        ledger_catchup_seconds=config.ledger_catchup_seconds,
        fast_frames=True,  # as the `bandgate worker` command runs it
    )
    app = ConsumerApp(settings)
    pause = config.handler_ms / 1000

    @app.consumer(
        config.queue,
        concurrency=config.concurrency,
        prefetch=config.prefetch,
        dedupe=config.dedupe,
        hot_reserve=config.hot_reserve,
    )
    async def handle(msg: Message) -> None:
        if config.record_ids:
            recorder.record_id(msg.message_id, msg.priority)
        recorder.record(msg.payload)
        if pause:
            await asyncio.sleep(pause)

    worker = Worker(app)

    def done() -> None:
        if worker.ledger is not None:  # still following? (the shutdown closes the follower)
            recorder.info["ledger_following"] = worker.ledger.following
        worker.stop()

    recorder.on_done = done
    announce = asyncio.create_task(_announce(worker.ready))
    settled = asyncio.create_task(_stop_when_settled(worker, config.expect_settled, done))
    try:
        await worker.serve()
    finally:
        announce.cancel()
        settled.cancel()
    recorder.info["outcomes"] = _outcomes(worker)
    if worker.ledger is not None:
        recorder.info["ledger_entries"] = len(worker.ledger.view)


async def _stop_when_settled(worker: Worker, expected: int, done: Callable[[], None]) -> None:
    """`done()` once the worker's metrics counted `expected` messages settled (0: never). The
    metrics are polled: a skip never reaches the handler, and a counter has nothing to await."""
    if not expected:
        return
    await worker.ready.wait()
    while sum(_outcomes(worker).values()) < expected:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    done()


def _outcomes(worker: Worker) -> dict[str, int]:
    """Messages settled so far, per outcome (`bandgate_consumed_total`)."""
    counts: Counter[str] = Counter()
    for family in worker.telemetry.consumed.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                counts[sample.labels["outcome"]] += int(sample.value)
    return dict(counts)


async def run_plain(config: WorkerConfig, recorder: Recorder) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    recorder.on_done = stop.set
    slots = asyncio.Semaphore(config.concurrency)
    pause = config.handler_ms / 1000

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        async with slots:
            recorder.record(orjson.loads(message.body))
            if pause:
                await asyncio.sleep(pause)
            await message.ack()

    connection = await aio_pika.connect(config.amqp_url)
    async with connection:
        consuming = []
        for name, prefetch in config.queues:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
            queue = await channel.get_queue(name)
            consuming.append((queue, await queue.consume(on_message)))
        print("ready", flush=True)
        await stop.wait()
        for queue, tag in consuming:
            await queue.cancel(tag)
        with contextlib.suppress(TimeoutError):  # let the handlers in hand finish and ack
            async with asyncio.timeout(5):
                for _ in range(config.concurrency):
                    await slots.acquire()


async def _announce(ready: asyncio.Event) -> None:
    await ready.wait()
    print("ready", flush=True)


def main() -> None:
    config = WorkerConfig(**json.loads(sys.argv[1]))
    config.queues = [(name, prefetch) for name, prefetch in config.queues]
    logging.basicConfig(level=logging.WARNING, format="worker %(levelname)s %(name)s: %(message)s")
    recorder = Recorder(config)
    if config.kind == "bandgate":
        run_on_event_loop(run_bandgate(config, recorder))  # the loop `bandgate worker` runs on
    else:
        run_on_event_loop(run_plain(config, recorder), config.plain_loop)
    Path(sys.argv[2]).write_bytes(orjson.dumps(recorder.result()))


class WorkerProcess(ChildProcess):
    """Start a worker process and wait until it consumes; `wait()` or `stop()` for its record.

    A subclass names another `MODULE` that says `ready` and stops on SIGTERM the same way."""

    MODULE: ClassVar[str] = "bench.worker_process"

    def __init__(self, config: DataclassInstance, start_timeout: float = 60.0) -> None:
        super().__init__(self.MODULE, config)
        try:
            self.expect_line("ready", start_timeout)
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """SIGTERM (a clean shutdown), then the record."""
        self.process.send_signal(signal.SIGTERM)
        record: dict[str, Any] = self.wait(timeout)
        return record


if __name__ == "__main__":
    main()

"""What every peer shares: its config, its processes' handles, the paced loop, the record.

A peer's worker runs as `python -m bench.peers.worker CONFIG OUT` and its hot publisher as
`python -m bench.peers.publisher CONFIG OUT`, the same protocol as `bench.worker_process` and
`bench.paced_publisher` (`ready`, `measuring`, `sent` on stdout; the record as JSON in OUT), so
`bench.hot_wait` times them as it times bandgate's. A worker that is another project's command
line (`celery worker`, `dramatiq`) is exec'd in place of that process, with the config and
OUT in environment variables (`CONFIG_ENV`, `OUT_ENV`) for the app module it loads.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, ClassVar

import orjson

from bench.child import ChildProcess
from bench.environment import BenchBroker
from bench.paced_publisher import FILLER, PacedPublisher
from bench.stage import depths
from bench.worker_process import Recorder, WorkerProcess

CONFIG_ENV = "BANDGATE_BENCH_PEER_CONFIG"
OUT_ENV = "BANDGATE_BENCH_PEER_OUT"


@dataclass
class PeerConfig:
    """One peer process's terms: the worker reads the first part, the publisher the second."""

    kind: str  # which peer: a key of `bench.peers.worker.SERVE` and `publisher.SENDERS`
    url: str  # the AMQP URL, or PostgreSQL's connection string
    concurrency: int = 16
    handler_ms: float = 0.0
    run: str = ""  # hot messages of other runs count as background
    options: dict[str, Any] = field(default_factory=dict)  # the peer's own (queue names, ...)
    rate: float = 0.0  # the publisher: hot messages per second
    warmup_seconds: float = 0.0
    seconds: float = 0.0
    warmup: int = 1  # what `Recorder` reads besides `run`
    expect: int = 0
    broker_pid: int | None = None
    gateway_pid: int | None = None


@dataclass(frozen=True)
class Scenario:
    """What the orchestrator asks of every contender's backlog and worker."""

    backlog: int
    concurrency: int
    payload: dict[str, Any]


class LockedRecorder(Recorder):
    """`Recorder` for handlers on many threads (Celery's, Dramatiq's and the PostgreSQL
    worker's): `record` reads and writes shared counters."""

    def __init__(self, config: PeerConfig) -> None:
        super().__init__(config)
        self._lock = threading.Lock()

    def record(self, payload: Any) -> None:
        with self._lock:
            super().record(payload)

    def write(self, out: str) -> None:
        with self._lock:
            Path(out).write_bytes(orjson.dumps(self.result()))


class Peer(ABC):
    """The orchestrator's side of a peer: its queues or tables, its backlog, its processes."""

    name: ClassVar[str]
    needs: ClassVar[tuple[str, ...]]  # modules of the `bench` extra it imports

    def __init__(self, broker: BenchBroker, scenario: Scenario) -> None:
        self.broker = broker
        self.scenario = scenario

    @classmethod
    def missing(cls) -> list[str]:
        """The modules this peer needs that are not installed."""
        # (kombu replaces its module object by one without a spec: an imported one is there)
        return [name for name in cls.needs if name not in sys.modules and not find_spec(name)]

    @abstractmethod
    def setup(self) -> None:
        """Declare the peer's queues (or create its database); an empty backlog."""

    @abstractmethod
    def top_up(self) -> None:
        """Drop what is left of the last run's hot messages; bring the backlog to its size."""

    @abstractmethod
    def config(self) -> PeerConfig:
        """The config its worker and publisher processes start from."""

    def server_pid(self) -> int | None:
        """The process whose CPU counts as the broker's: RabbitMQ, unless it is another."""
        return self.broker.pid

    @abstractmethod
    def tear_down(self) -> None:
        """Delete what `setup` made; called once, also after a failure."""


class PeerWorker(WorkerProcess):
    MODULE: ClassVar[str] = "bench.peers.worker"


class PeerPublisher(PacedPublisher):
    """`PacedPublisher`'s handle on `bench.peers.publisher`."""

    def __init__(self, config: PeerConfig) -> None:
        ChildProcess.__init__(self, "bench.peers.publisher", config)
        self.seconds = config.seconds


def hot_payload(seq: int, t: float, run: str) -> dict[str, Any]:
    """A hot message's payload, what `bench.paced_publisher` writes (about 1 KiB)."""
    return {"seq": seq, "t": t, "run": run, "data": FILLER}


def pace(config: PeerConfig, send: Callable[[dict[str, Any]], None]) -> dict[int, float]:
    """`send` hot payloads at `rate` per second, `warmup_seconds` of them with negative `seq`,
    then `seconds` measured ones; say `measuring` and `sent`. Publish time of each measured one.

    Late sends (a client slower than the rate for a moment) go out back to back until the
    schedule is met again, as `bench.paced_publisher` does."""
    warmup = round(config.warmup_seconds * config.rate)
    total = warmup + round(config.seconds * config.rate)
    sent: dict[int, float] = {}
    start = time.monotonic()
    for n in range(total):
        pause = start + n / config.rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        seq = n - warmup
        if seq == 0:
            print("measuring", flush=True)
        t = time.time()
        send(hot_payload(seq, t, config.run))
        if seq >= 0:
            sent[seq] = t
    print("sent", flush=True)
    return sent


def exec_command(config: PeerConfig, out: str, argv: list[str]) -> None:
    """Become `python -m <argv>` (a peer's own command line), the config and OUT passed on in
    the environment: the pid, and the stdout the parent reads, stay this process's."""
    os.environ[CONFIG_ENV] = json.dumps(asdict(config))
    os.environ[OUT_ENV] = out
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", *argv])


def config_from_env() -> tuple[PeerConfig, str] | None:
    """The config and OUT `exec_command` passed on; None outside such a process."""
    raw = os.environ.get(CONFIG_ENV)
    if raw is None:
        return None
    return PeerConfig(**json.loads(raw)), os.environ[OUT_ENV]


def say(line: str) -> None:
    """A line to the parent, on the process's stdout as started: Celery and Dramatiq replace
    `sys.stdout` with their loggers."""
    os.write(1, f"{line}\n".encode())


def wait_for_depth(url: str, queue: str, expected: int, timeout: float = 60.0) -> None:
    """Wait until `queue` holds `expected` messages or more: a client that publishes without
    confirms (Celery's and Dramatiq's, by default) returns before the broker has them all."""
    deadline = time.monotonic() + timeout
    while asyncio.run(depths(url, (queue,)))[0] < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{queue} did not reach {expected} messages in {timeout:g} s")
        time.sleep(0.1)

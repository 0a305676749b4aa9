"""HTTP receivers (`bandgate.pull`) against the Python worker, on one broker, in one run.

One gateway process serves every part (`bandgate gateway`, which serves the receivers too);
the HTTP client (`bench.pull_client`) and the worker (`bench.worker_process`, the library as
`bandgate worker` runs it) are processes of their own. Three parts:

- drain: a backlog of `--messages` small messages, in one band and spread over three, drained
  by `RECEIVERS` receive loops (`MAX_MESSAGES` per receive, `WAIT_SECONDS`, then one batch
  ack; and, the row `HTTP_ACKING`, with each receive acking the batch before it, one request
  per batch; and, the row `HTTP_TWO`, that behind a gateway of two processes), and by the
  worker with a no-op handler at its default concurrency and at `RECEIVERS x MAX_MESSAGES`
  (as many messages in hand as the loops may hold). The rate is
  timed from the `WARMUP`-th message received to the last; CPU seconds of the client (the HTTP
  client or the worker), the gateway and the broker between the same two moments, per 1,000
  messages. `vs_c<N>`: the rate over the worker's at concurrency N, the median of the rounds'.
  Each HTTP drain's gateway is sized for the loops' leases (`DRAIN_SETTINGS`).
- wake: an empty queue, one client in a long poll (`wait_seconds` 20), and messages published
  through the gateway one at a time, `WAKE_MESSAGES` per run at random intervals of 50-200 ms;
  latency = the moment the receive returned - the moment just before the publish was sent.
  The worker's peer: its handler start - the same moment. Percentiles pool every round's
  messages (`p99_ms_runs`: each round's p99).
- hot: `bench priority`'s scenario and loads (cold backlog, hot messages at a steady rate,
  hot wait = handler start - publish; `HOT_SECONDS` measured per run), with `bench priority`'s
  worker (`priority.CONCURRENCY` slots) against as many receive loops of one message each; a
  loop's handler is a sleep of the load's duration, and the next receive acks it (the row
  "ack apart": then a batch ack, before the next receive). Each row is the run with the
  median p99; `p99_vs_worker` is the median of the rounds' ratios. The worker
  caps the cold messages in hand (its strict policy's prefetch); the receivers do not, and
  drain cold faster.

Every part checks that each message was received exactly once: `received` (messages, or ids
for HTTP), `repeated` (received again), `left` (ready in the bands afterwards), `errors`
(responses other than the expected status, and receipts an ack refused).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aio_pika
import httpx

from bandgate.consumers.consumer import DEFAULT_CONCURRENCY
from bandgate.topology import naming, wire
from bandgate.topology.loader import load_topology
from bench import priority
from bench.environment import BenchBroker, wait_for_quiet
from bench.pull_client import PullClient, PullClientConfig
from bench.raw_amqp import fill
from bench.rounds import ROUNDS, median_run, paired_ratios
from bench.stage import QUEUE, floor_process, gateway_process, reset_bands
from bench.worker_process import WorkerConfig, WorkerProcess

WARMUP = 1_000
RECEIVERS = 8
MAX_MESSAGES = 10
WAIT_SECONDS = 1.0
CONCURRENCIES = (DEFAULT_CONCURRENCY, RECEIVERS * MAX_MESSAGES)
PAYLOAD = {"data": "x" * 100}
SCENARIOS = (("1 band", (8,)), ("3 bands", (8, 5, 1)))
WAKE_MESSAGES = 100
WAKE_WAIT = 20.0
WAKE_GRACE = 1.0  # for the worker to handle the last message after it was published
HOT_SECONDS = 5.0  # measured per run; half of `bench priority`'s, to keep a run near 5 minutes
# The drain's loops hold up to RECEIVERS x MAX_MESSAGES (80) leases under one token. A token
# may hold half of a queue's leases in a process (the tenancy rule, `PullSettings.token_leases`),
# and by default a queue has 85 (64 MiB of prefetch / (3 bands x 256 KiB bodies)): 42, which
# capped the loops at about 5.5 messages a receive and answered some receives 429. A deployment
# whose one client holds 80 leases sizes the prefetch for them, as this: 170 leases a queue,
# 85 a token; the rule itself stays.
DRAIN_SETTINGS = {"BANDGATE_PULL_MAX_PREFETCH_BYTES": str(128 << 20)}
HTTP = f"HTTP {RECEIVERS} loops x {MAX_MESSAGES}"
HTTP_ACKING = f"{HTTP}, ack in receive"
# The same behind a gateway of two processes (`BANDGATE_WORKERS=2`): one process is CPU-bound
# in the drain, and the issue asks where more processes per machine pay.
HTTP_TWO = f"{HTTP_ACKING}, 2 gateway processes"
# What uvicorn and one AMQP consumer cost with none of the receivers' machinery (issue 35
# asks the drain at 0.9x the worker: this row shows how much of that the server and the
# client library leave). One band: the floor consumes the one-band scenario's only.
FLOOR = f"floor: uvicorn + one aiormq consumer, {RECEIVERS} loops x {MAX_MESSAGES}, ack in receive"


class Stage:
    """The broker, the gateway and the bands every run of the benchmark shares."""

    def __init__(self, broker: BenchBroker, port: int, gateway_pid: int, bands: list[str]):
        self.broker = broker
        self.bands = bands
        self.client = PullClientConfig(
            port=port, broker_pid=broker.pid, gateway_pid=gateway_pid, warmup=WARMUP
        )
        self.worker = WorkerConfig(
            kind="bandgate",
            amqp_url=broker.amqp_url,
            concurrency=DEFAULT_CONCURRENCY,
            queue=QUEUE,
            warmup=WARMUP,
            broker_pid=broker.pid,
            gateway_pid=gateway_pid,
        )

    def left(self) -> int:
        """Messages ready in the bands."""
        return asyncio.run(_ready(self.broker.amqp_url, self.bands))


def run_pull(broker: BenchBroker, messages: int, only: str | None = None) -> list[dict[str, Any]]:
    """Every part, or those `only` names (comma-separated: drain, wake, hot)."""
    wanted = {word.strip() for word in (only or "drain,wake,hot").split(",")}
    bands = asyncio.run(reset_bands(broker))
    with gateway_process(broker) as (port, gateway_pid):
        _wait_ready(port)
        stage = Stage(broker, port, gateway_pid, bands)
        rows: list[dict[str, Any]] = []
        try:
            parts: dict[str, Callable[[], list[dict[str, Any]]]] = {
                "drain": lambda: _drains(stage, messages),
                "wake": lambda: _wakes(stage),
                "hot": lambda: _hot(stage),
            }
            for name, part in parts.items():  # with the time each took: a busy machine shows
                if name not in wanted:
                    continue
                started = time.monotonic()
                rows += part()
                print(f"pull: {name} took {time.monotonic() - started:.0f} s", flush=True)
        finally:
            asyncio.run(reset_bands(broker))
    return rows


# -- drain ----------------------------------------------------------------------------------


def _drains(stage: Stage, messages: int) -> list[dict[str, Any]]:
    http = replace(
        stage.client,
        receivers=RECEIVERS,
        max_messages=MAX_MESSAGES,
        wait_seconds=WAIT_SECONDS,
        expect=messages,
    )
    workers = {
        f"worker, concurrency {c}": replace(stage.worker, concurrency=c, expect=messages)
        for c in CONCURRENCIES
    }
    acking = replace(http, ack_in_receive=True)
    clients = {HTTP: (http, 1), HTTP_ACKING: (acking, 1), HTTP_TWO: (acking, 2), FLOOR: (acking, 0)}
    rows = []
    for scenario, priorities in SCENARIOS:
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(ROUNDS):
            for name in [*clients, *workers]:
                if name == FLOOR and len(priorities) > 1:
                    continue
                _fill(stage, priorities, messages)
                wait_for_quiet()
                if name in clients:
                    record = _drain_over_http(stage, *clients[name])
                else:
                    with WorkerProcess(workers[name]) as worker:
                        record = worker.wait(timeout=300)
                runs.setdefault(name, []).append(_drain_row(stage, name, record, messages))
        ratios = {c: paired_ratios(runs, f"worker, concurrency {c}") for c in CONCURRENCIES}
        for name, done in runs.items():
            row = median_run(done, "rate")
            for c in CONCURRENCIES:
                row[f"vs_c{c}"], row[f"vs_c{c}_runs"] = ratios[c][name]
            rows.append({"part": f"drain, {scenario}", **row, "name": name})
    return rows


def _drain_over_http(stage: Stage, config: PullClientConfig, processes: int) -> dict[str, Any]:
    """A drain through a gateway of its own, of `processes` processes (0: the floor), stopped
    after it: before RabbitMQ 4.3 a paused receiver keeps what it holds for its next receive,
    and a shared gateway once held 21 messages of the next run's backlog (the worker waited
    300 s for them; where they came from was not found)."""
    server = (
        gateway_process(stage.broker, processes, DRAIN_SETTINGS)
        if processes
        else floor_process(stage.broker, "bench.pull_floor:app")
    )
    with server as (port, gateway_pid):
        _wait_ready(port)
        with PullClient(replace(config, port=port, gateway_pid=gateway_pid)) as client:
            record: dict[str, Any] = client.wait(timeout=300)
    return record


def _fill(stage: Stage, priorities: tuple[int, ...], messages: int) -> None:
    """`messages` messages, an equal share at each of `priorities`, routed as bandgate does."""
    exchange = load_topology().exchange
    for index, priority_ in enumerate(priorities):
        share = messages // len(priorities) + (index < messages % len(priorities))
        message = wire.encode(wire.Envelope(queue=QUEUE, payload=PAYLOAD, priority=priority_))
        routing_key = naming.routing_key(QUEUE, priority_)
        fill(stage.broker.amqp_url, exchange, routing_key, message, share)


def _drain_row(stage: Stage, name: str, record: dict[str, Any], messages: int) -> dict[str, Any]:
    timed = messages - WARMUP
    seconds = record["last_at"] - record["first_at"]
    cpu = {
        part: record[f"last_{key}"] - record[f"first_{key}"]
        for part, key in (("client", "cpu"), ("gateway", "gateway_cpu"), ("broker", "broker_cpu"))
    }
    busy = record["last_machine_busy"] - record["first_machine_busy"]
    http = "received_ids" in record
    received = record["received_ids"] if http else record["handled"]
    left = stage.left()
    return {
        "name": name,
        "rate": timed / seconds,
        **{f"{part}_cpu_s": value for part, value in cpu.items()},
        "cpu_s_per_1k": sum(cpu.values()) / timed * 1000,
        "other_cores": (busy - sum(cpu.values())) / seconds,
        "received": received,
        # The worker sees no ids: what it handled beyond the messages that left the queue.
        "repeated": record["repeated_ids"] if http else record["handled"] - (messages - left),
        "left": left,
        "errors": _errors(record),
    }


# -- wake -----------------------------------------------------------------------------------


def _wakes(stage: Stage) -> list[dict[str, Any]]:
    http = replace(
        stage.client,
        receivers=1,
        max_messages=MAX_MESSAGES,
        wait_seconds=WAKE_WAIT,
        publish=WAKE_MESSAGES,
        expect=WAKE_MESSAGES + stage.client.warmup_publish,
        warmup=1,
    )
    publisher = replace(http, receivers=0, expect=0)
    names = (
        f"HTTP long poll, wait_seconds {WAKE_WAIT:g}",
        f"worker, concurrency {DEFAULT_CONCURRENCY}",
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_ in range(ROUNDS):
        for name in names:
            wait_for_quiet()
            run = f"wake-{round_}-{time.time():.0f}"
            if name == names[0]:
                with PullClient(replace(http, run=run, seed=round_)) as client:
                    record = client.wait(timeout=WAKE_MESSAGES * 0.2 + 60)
                    sent = record
            else:
                with WorkerProcess(replace(stage.worker, run=run, warmup=1)) as worker:
                    with PullClient(replace(publisher, run=run, seed=round_)) as client:
                        sent = client.wait(timeout=WAKE_MESSAGES * 0.2 + 60)
                    time.sleep(WAKE_GRACE)
                    record = worker.stop()
            runs[name].append(_wake_run(record, sent))
    return [_wake_row(name, done, stage.left()) for name, done in runs.items()]


def _wake_run(record: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    waits = record["waits"]
    return {
        "latencies_ms": [waits[seq] * 1000 for seq in sent["sent"] if seq in waits],
        "sent": len(sent["sent"]),
        "unhandled": sum(1 for seq in sent["sent"] if seq not in waits),
        "repeated": record["duplicates"] + record.get("repeated_ids", 0),
        "publish_ms": sent["publish_ms"],
        "errors": _errors(record) + _errors(sent),
    }


def _wake_row(name: str, runs: list[dict[str, Any]], left: int) -> dict[str, Any]:
    latencies = sorted(ms for run in runs for ms in run["latencies_ms"])
    return {
        "part": "wake",
        "name": name,
        "sent": sum(run["sent"] for run in runs),
        "received": len(latencies),
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": latencies[-1],
        "p99_ms_runs": "/".join(f"{percentile(run['latencies_ms'], 99):.1f}" for run in runs),
        "publish_p50_ms": statistics.median(ms for run in runs for ms in run["publish_ms"]),
        "unhandled": sum(run["unhandled"] for run in runs),
        "repeated": sum(run["repeated"] for run in runs),
        "left": left,
        "errors": sum(run["errors"] for run in runs),
    }


# -- hot under a cold backlog ---------------------------------------------------------------


def _hot(stage: Stage) -> list[dict[str, Any]]:
    exchange = load_topology().exchange
    worker = priority.contenders(stage.broker.amqp_url, exchange, stage.bands)[0]
    slots = priority.CONCURRENCY
    http = replace(worker, name=f"HTTP {slots} loops x 1")
    apart = replace(worker, name=f"HTTP {slots} loops x 1, ack apart")
    client = replace(stage.client, receivers=slots, max_messages=1, wait_seconds=WAIT_SECONDS)

    def loops(acking: bool) -> Callable[[WorkerConfig], WorkerProcess]:
        def start(config: WorkerConfig) -> WorkerProcess:
            given = replace(client, handler_ms=config.handler_ms, run=config.run)
            return PullClient(replace(given, ack_in_receive=acking))

        return start

    gateway_pid = stage.client.gateway_pid
    rows = []
    for load in priority.LOADS:
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(ROUNDS):
            for contender, start in (
                (http, loops(acking=True)),
                (apart, loops(acking=False)),
                (worker, WorkerProcess),
            ):
                priority.top_up(stage.broker, contender)
                wait_for_quiet()
                run = f"hot-{load.name}-{contender.name}-{time.time():.0f}"
                row = priority.measure(
                    stage.broker, contender, load, run, start, gateway_pid, HOT_SECONDS
                )
                runs.setdefault(contender.name, []).append(row)
        ratios = paired_ratios(runs, worker.name, "p99_ms")
        for name, done in runs.items():
            row = median_run(done, "p99_ms")
            for key in [key for key in row if key.startswith("vs_c")]:
                del row[key]
            row["p99_vs_worker"], row["p99_vs_worker_runs"] = ratios[name]
            rows.append({"part": f"hot, {load.name} load", **row, "name": name})
    return rows


# -- shared ---------------------------------------------------------------------------------


def percentile(ordered: list[float], q: int) -> float:
    """The `q`-th percentile of sorted values, interpolated between the two nearest (the
    inclusive method: never beyond the largest, which the exclusive one passes for a few
    hundred values); the only value when there is one, NaN for none."""
    if len(ordered) < 2:
        return ordered[0] if ordered else float("nan")
    return statistics.quantiles(ordered, n=100, method="inclusive")[q - 1]


def _errors(record: dict[str, Any]) -> int:
    """Responses other than the expected status, and receipts an ack refused."""
    unexpected: dict[str, int] = record.get("unexpected", {})
    return sum(unexpected.values()) + len(record.get("ack_failed", []))


async def _ready(url: str, names: list[str]) -> int:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        total = 0
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            total += queue.declaration_result.message_count or 0
    return total


def _wait_ready(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
        while time.monotonic() < deadline:
            try:
                if http.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise RuntimeError(f"the gateway was not ready in {timeout:g} s")

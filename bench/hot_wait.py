"""One run of the priority benchmark, whoever the contender: a worker process draining a
backlog, a paced publisher of hot messages, and what they recorded, as one row.

The worker is started first and left `SETTLE` s to take its first deliveries; the publisher
sends its warm-up, then its measured messages; `GRACE` s after the last one the worker is
stopped and gives its record. Wait = handler start - publish time. A hot message still
unhandled then counts with its wait so far (a lower bound), and `unhandled` says how many did.
CPU is in cores over the measured window: the worker, the broker (or the server holding the
queue), the load generator, and everything else on the machine (`other_cores`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.environment import cpu_seconds, machine_busy_seconds
from bench.paced_publisher import PacedPublisher
from bench.worker_process import WorkerProcess

SETTLE = 1.0
GRACE = 2.0


def percentile(ordered: list[float], q: int) -> float:
    return statistics.quantiles(ordered, n=100)[q - 1]


def timed_run(
    name: str,
    worker: Callable[[], WorkerProcess],
    publisher: Callable[[], PacedPublisher],
    broker_pid: int | None,
    gateway_pid: int | None = None,
) -> dict[str, Any]:
    """Run `worker()` under `publisher()`'s hot messages; the row named `name`."""
    with worker() as consumer:
        time.sleep(SETTLE)
        with publisher() as load:
            pids = (broker_pid, consumer.pid, load.pid, gateway_pid)
            load.measuring()
            cpu0, t0 = [cpu_seconds(pid) for pid in pids], time.time()
            busy0 = machine_busy_seconds()
            load.sent()
            cpu1, t1 = [cpu_seconds(pid) for pid in pids], time.time()
            busy1 = machine_busy_seconds()
            sent = load.result()
        time.sleep(max(0.0, t1 + GRACE - time.time()))
        end = time.time()
        record = consumer.stop()
    handled: dict[str, float] = record["waits"]
    waits = sorted(
        handled[str(seq)] if str(seq) in handled else end - published
        for seq, published in sent.items()
    )
    waits_ms = [wait * 1000 for wait in waits]
    background = record["background"]
    whole = range(int(t0) + 1, int(t1))  # the seconds wholly inside the measured window
    cold = sum(background.get(str(second), 0) for second in whole) / max(1, len(whole))
    window = t1 - t0
    broker_cpu, worker_cpu, publisher_cpu, gateway_cpu = (
        (after - before) / window for before, after in zip(cpu0, cpu1, strict=True)
    )
    gateway = {} if gateway_pid is None else {"gateway_cores": gateway_cpu}
    others = (busy1 - busy0) / window - broker_cpu - worker_cpu - publisher_cpu
    others -= sum(gateway.values())
    return {
        "name": name,
        "hot_msgs": len(sent),
        "unhandled": sum(1 for seq in sent if str(seq) not in handled),
        "duplicates": record["duplicates"],
        "p50_ms": percentile(waits_ms, 50),
        "p99_ms": percentile(waits_ms, 99),
        "max_ms": waits_ms[-1],
        "cold_msg_s": cold,
        "worker_cores": worker_cpu,
        **gateway,
        "broker_cores": broker_cpu,
        "load_cores": publisher_cpu,
        "other_cores": others,
    }

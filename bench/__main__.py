"""`python -m bench [publish|delay|consume|acks|priority|memory|native|shards|pull|ledger|
tenants|cluster|all]`: benchmarks against the raw aio-pika client and the alternatives, in one
run on one broker, printed as tables and written as JSON under bench/results/. `all` takes
about 25 minutes on two cores, `tenants` (fair bands under a noisy tenant) about 5 more,
`ledger` (the tombstone ledger's costs) about 5 minutes more, and
`cluster` (what a three-node cluster spends per message, on nodes of its own) about 5 more.

A benchmark whose rows carry a `part` prints a table per part."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.acks import run_acks
from bench.cluster import run_cluster
from bench.consume import run_consume
from bench.delay import run_delay
from bench.environment import BenchBroker, bench_broker
from bench.ledger import run_ledger
from bench.memory import run_memory
from bench.native import run_native
from bench.priority import run_priority
from bench.publish import run_publish
from bench.pull import run_pull
from bench.reserve import run_reserve
from bench.shards import run_shards
from bench.tenants import run_tenants

RESULTS = Path("bench/results")

Runner = Callable[[BenchBroker, argparse.Namespace], list[dict[str, Any]]]
BENCHMARKS: dict[str, Runner] = {
    "publish": lambda broker, args: run_publish(broker, args.messages),
    "delay": lambda broker, args: run_delay(broker),
    "consume": lambda broker, args: run_consume(broker),
    "acks": lambda broker, args: run_acks(broker),
    "priority": lambda broker, args: run_priority(broker, args.only),
    "memory": lambda broker, args: run_memory(broker),
    "native": lambda broker, args: run_native(broker),
    "shards": lambda broker, args: run_shards(broker),
    "pull": lambda broker, args: run_pull(broker, args.messages, args.only),
    "ledger": lambda broker, args: run_ledger(broker),
    "tenants": lambda broker, args: run_tenants(broker, args.only),
    "reserve": lambda broker, args: run_reserve(broker),
}
# Benchmarks that start brokers of their own (a cluster), after the others.
OWN_BROKERS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]]] = {
    "cluster": lambda args: run_cluster(args.rabbitmq),
}


def tables(name: str, rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """One table, or one per `part` the rows name, in the order the parts first appear."""
    parts = dict.fromkeys(row.get("part") for row in rows)
    return [
        (
            name if part is None else f"{name}: {part}",
            [
                {k: v for k, v in row.items() if k != "part"}
                for row in rows
                if row.get("part") == part
            ],
        )
        for part in parts
    ]


def table(title: str, rows: list[dict[str, Any]]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row if key != "name"))
    width = max(len(row["name"]) for row in rows) + 2
    widths = [
        max(12, len(c) + 2, *(len(_cell(row.get(c), 0)) + 2 for row in rows)) for c in columns
    ]
    lines = [
        title,
        f"{'':<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)),
    ]
    for row in rows:
        cells = "".join(_cell(row.get(c), w) for c, w in zip(columns, widths, strict=True))
        lines.append(f"{row['name']:<{width}}{cells}")
    return "\n".join(lines)


def _cell(value: Any, width: int) -> str:
    if isinstance(value, float):
        return f"{value:>{width}.2f}" if abs(value) < 100 else f"{value:>{width}.0f}"
    return f"{value!s:>{width}}"


def _print(name: str, rows: list[dict[str, Any]]) -> None:
    for title, part in tables(name, rows):
        print(table(title, part), end="\n\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument(
        "which", choices=[*BENCHMARKS, *OWN_BROKERS, "all"], nargs="?", default="all"
    )
    # Raw publishing is timed over this many messages: 20,000 take about 2 s, against the
    # gateway's 5 s of wrk; 5,000 (0.5 s) let one broker stall swing a round's ratio. `pull`
    # drains backlogs of this many.
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument(
        "--only",
        metavar="WORDS",
        help="priority: run only the contenders whose names contain one of these "
        "comma-separated words, e.g. bandgate,celery (case-insensitive); pull: only these "
        "parts (drain, wake, hot); tenants: http (HTTP receive loops in the place of the worker)",
    )
    parser.add_argument(
        "--rabbitmq",
        choices=["3.10", "4.0", "4.3"],
        help="run the private node of this RabbitMQ version (default: the installed one)",
    )
    parser.add_argument(
        "--broker-conf",
        metavar="LINE",
        action="append",
        default=[],
        help="a rabbitmq.conf line for the private node, e.g. "
        "'quorum_queue.compute_checksums = false' (repeatable)",
    )
    parser.add_argument(
        "--broker-advanced",
        metavar="TERM",
        default="",
        help="an advanced.config term for the private node, e.g. "
        "'[{ra, [{wal_sync_method, none}]}].'",
    )
    parser.add_argument(
        "--default-wal",
        action="store_true",
        help="size the private node's quorum WAL at RabbitMQ's default (512 MiB) instead of "
        "bandgate's 64 MiB",
    )
    parser.add_argument(
        "--broker-in-memory",
        action="store_true",
        help="keep the private node's data in /dev/shm (tmpfs): no stalls of this machine's "
        "disk in the p99s (docs/benchmarks.md, 'The disk under the broker')",
    )
    parser.add_argument(
        "--broker-busy-wait",
        action="store_true",
        help="leave the private node's schedulers busy waiting (RabbitMQ's default); bandgate's "
        "private nodes turn it off, sharing their cores with Python (ops/local_broker.py)",
    )
    args = parser.parse_args()
    chosen = [*BENCHMARKS, *OWN_BROKERS] if args.which == "all" else [args.which]
    results: dict[str, list[dict[str, Any]]] = {}
    version = "unknown"
    if any(name in BENCHMARKS for name in chosen):
        with bench_broker(
            args.rabbitmq,
            tuple(args.broker_conf),
            args.broker_advanced,
            args.default_wal,
            in_memory=args.broker_in_memory,
            busy_wait=args.broker_busy_wait,
        ) as broker:
            for name in (name for name in chosen if name in BENCHMARKS):
                results[name] = BENCHMARKS[name](broker, args)
                _print(name, results[name])
            version = broker.version  # a benchmark reads it off the broker it connects to
    for name in (name for name in chosen if name in OWN_BROKERS):
        results[name] = OWN_BROKERS[name](args)
        _print(name, results[name])
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = {
        "date": stamp,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "broker": f"RabbitMQ {version}",
        "command": f"python -m bench {args.which}"
        + (f" --only {args.only}" if args.only else "")
        + (f" --rabbitmq {args.rabbitmq}" if args.rabbitmq else "")
        + "".join(f" --broker-conf {line!r}" for line in args.broker_conf)
        + (f" --broker-advanced {args.broker_advanced!r}" if args.broker_advanced else "")
        + (" --default-wal" if args.default_wal else "")
        + (" --broker-in-memory" if args.broker_in_memory else "")
        + (" --broker-busy-wait" if args.broker_busy_wait else ""),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.which}-{stamp.replace(':', '')}.json"
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(json.dumps(meta), f"\nwritten {out}")


if __name__ == "__main__":
    main()

"""The broker a benchmark runs against: `BANDGATE_BENCH_AMQP_URL`, or a private node."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bandgate.ops.local_broker import (
    NO_BUSY_WAIT,
    QUORUM_WAL_MAX_SIZE_BYTES,
    LocalBroker,
    configured_root,
)
from tools.broker_roots import root_for

MEMORY = "/dev/shm"  # tmpfs on Linux


@dataclass
class BenchBroker:
    amqp_url: str
    pid: int | None
    version: str = "unknown"


@contextmanager
def bench_broker(
    version: str | None = None,
    settings: tuple[str, ...] = (),
    advanced: str = "",
    default_wal: bool = False,
    in_memory: bool = False,
    busy_wait: bool = False,
) -> Iterator[BenchBroker]:
    """`BANDGATE_BENCH_AMQP_URL`, or a private node: of `version` (3.10, 4.0, 4.3; from a
    Debian root of `tools.broker_roots`, built when missing) or the installed one, with
    `settings` (rabbitmq.conf lines) and `advanced` (an advanced.config term) added; its
    quorum WAL sized as bandgate's nodes are, or at RabbitMQ's default with `default_wal`;
    its data in `MEMORY` with `in_memory`: a quorum queue delivers a message once its WAL
    write is synced, and this machine's disk stalls writes for 0.3-0.6 s now and then, which
    every message published meanwhile waits out (docs/benchmarks.md); its schedulers without
    busy waiting, as every private node's (`NO_BUSY_WAIT`), unless `busy_wait` (RabbitMQ's
    default)."""
    url = os.environ.get("BANDGATE_BENCH_AMQP_URL")
    if url:
        yield BenchBroker(url, None)
        return
    root = root_for(version) if version else configured_root()
    if in_memory and not Path(MEMORY).is_dir():
        raise RuntimeError(f"no {MEMORY} here for a broker in memory")
    with tempfile.TemporaryDirectory(
        prefix="bandgate-bench-", dir=MEMORY if in_memory else None
    ) as tmp:
        # The consistent-hash exchange is what sharded bands route with (`python -m bench native`).
        plugins = ("rabbitmq_consistent_hash_exchange",)
        node = LocalBroker(
            Path(tmp),
            name="bandgate-bench",
            plugins=plugins,
            root=root,
            settings=settings,
            advanced=advanced,
            quorum_wal_max_size_bytes=None if default_wal else QUORUM_WAL_MAX_SIZE_BYTES,
            erl_args="" if busy_wait else NO_BUSY_WAIT,
        )
        node.start()
        try:
            assert node.process is not None
            yield BenchBroker(node.amqp_url, node.process.pid)
        finally:
            node.stop()


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time so far of a process and all its descendants (Linux /proc).

    The private node's pid is the `rabbitmq-server` script's; the Erlang VM doing the work is
    its child, whose time only shows in the parent's own counters once it has exited, so the
    live descendants are summed too.
    """
    if pid is None:
        return float("nan")
    stats = _all_stats()
    if pid not in stats:
        return float("nan")
    ticks = sum(stats[member][1] for member in _tree(pid, stats))
    return ticks / os.sysconf("SC_CLK_TCK")


def written_bytes(pid: int) -> int:
    """Bytes a process and its descendants caused to be written to storage so far
    (`write_bytes` in /proc/<pid>/io: counted when a page is dirtied, so page-grained)."""
    total = 0
    for member in _tree(pid, _all_stats()):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{member}/io").read_text().splitlines():
                if line.startswith("write_bytes:"):
                    total += int(line.split()[1])
    return total


def _tree(pid: int, stats: dict[int, tuple[int, int]]) -> list[int]:
    """`pid` and every live descendant of it, from `_all_stats()`."""
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def machine_busy_seconds() -> float:
    """CPU time every core of the machine spent busy so far (all processes), from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(threshold: float = 0.3, patience: float = 20.0) -> float:
    """Wait until the machine is quiet: less than `threshold` cores busy over a second (other
    people's processes share the benchmark machine); give up after `patience` seconds.

    Returns the last level seen, in cores, for the report.
    """
    deadline = time.monotonic() + patience
    while True:
        before = machine_busy_seconds()
        time.sleep(1.0)
        busy = machine_busy_seconds() - before
        if busy < threshold or time.monotonic() > deadline:
            return busy


def _all_stats() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, CPU ticks: user, system and waited-for children's)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        stats[int(entry.name)] = (int(fields[1]), sum(int(value) for value in fields[11:15]))
    return stats


def rss_kib(pid: int) -> int:
    """Resident set size of a process (VmRSS in /proc/<pid>/status), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for process {pid}")


def wait_for_line(process: subprocess.Popen[bytes], expected: str, timeout: float) -> None:
    """Read an unbuffered child's stdout until the line `expected`; RuntimeError when the
    child exits or says nothing of the kind within `timeout` seconds."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"no {expected!r} from {process.args!r} in {timeout:g} s")
        readable, _, _ = select.select([process.stdout], [], [], remaining)
        if not readable:
            continue
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"{process.args!r} exited before saying {expected!r}")
        if line.decode().strip() == expected:
            return

"""The broker a benchmark runs against: `BANDGATE_BENCH_AMQP_URL`, or a private node."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gateway.local_broker import LocalBroker


@dataclass
class BenchBroker:
    amqp_url: str
    pid: int | None
    version: str = "unknown"


@contextmanager
def bench_broker() -> Iterator[BenchBroker]:
    url = os.environ.get("BANDGATE_BENCH_AMQP_URL")
    if url:
        yield BenchBroker(url, None)
        return
    with tempfile.TemporaryDirectory(prefix="bandgate-bench-") as tmp:
        node = LocalBroker(Path(tmp), name="bandgate-bench", plugins=())
        node.start()
        try:
            assert node.process is not None
            yield BenchBroker(node.amqp_url, node.process.pid)
        finally:
            node.stop()


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process and its children so far (Linux /proc)."""
    if pid is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    ticks = sum(int(value) for value in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")

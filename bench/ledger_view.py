"""The memory a `LedgerView` keeps, in a fresh process: `python -m bench.ledger_view CONFIG OUT`.

The view is filled as a follower fills it: each entry is built, encoded, decoded and applied,
one at a time, so what stays is what the view keeps (its keys, tuples and dict tables) and the
transient objects' memory is reused. RSS (VmRSS) is read before and after; with `traced`,
tracemalloc counts the bytes Python allocated and kept instead. Tracing inflates RSS with its
own bookkeeping, so the two are measured in separate processes.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import orjson

from bandgate.core.ledger import LedgerView, cancel, decode, handled
from bandgate.topology.model import LedgerSettings
from bandgate.topology.wire import new_message_id
from bench.child import ChildProcess
from bench.environment import rss_kib


@dataclass
class ViewConfig:
    tombstones: int  # cancel entries, each of its own id
    handled: int  # handled entries, of other ids
    traced: bool
    queue: str = "orders"


def fill_view(config: ViewConfig) -> LedgerView:
    view = LedgerView(LedgerSettings().max_age_seconds)
    for _ in range(config.tombstones):
        view.apply(decode(cancel(config.queue, new_message_id()).encode()))
    for _ in range(config.handled):
        view.apply(decode(handled(config.queue, new_message_id(), 0).encode()))
    return view


def main() -> None:
    config = ViewConfig(**json.loads(sys.argv[1]))
    gc.collect()
    if config.traced:
        tracemalloc.start()
    rss_before = rss_kib(os.getpid())
    traced_before = tracemalloc.get_traced_memory()[0]
    view = fill_view(config)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - traced_before
    rss = rss_kib(os.getpid()) - rss_before
    record = {"entries": len(view), "rss_bytes": rss * 1024}
    if config.traced:
        record["traced_bytes"] = traced
    Path(sys.argv[2]).write_bytes(orjson.dumps(record))


def measure(config: ViewConfig, timeout: float = 300.0) -> dict[str, int]:
    """Run the child and return its record: entries, rss_bytes (and traced_bytes)."""
    with ChildProcess("bench.ledger_view", config) as child:
        record: dict[str, int] = child.wait(timeout)
    return record


if __name__ == "__main__":
    main()

"""The topology of the "bandgate classic bands" contender: `orders`' bands as classic queues.

`bench priority` compares bandgate's waterfall over quorum bands with single classic priority
queues and with peers whose queues are classic; this contender runs the same worker over the
same three bands, each `type = "classic"` (exact priority order inside a band, not
replicated), so that the table separates what the waterfall costs from what replication costs.
It is a second logical queue, `orders_classic`, added to the topology in a file of its own
(the project's `bandgate.toml` plus that queue), which the bench applies and the worker loads
(`BANDGATE_TOPOLOGY`, set while its process starts).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bandgate.topology.loader import TOPOLOGY_ENV, load_topology, topology_path
from bandgate.topology.model import QueueSpec

QUEUE = "orders_classic"


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return str(value)


def section(spec: QueueSpec, name: str = QUEUE) -> str:
    """TOML for a queue named `name` with `spec`'s bands, each a classic queue."""
    lines = [f"[queues.{name}]"]
    for band in spec.bands:
        fields = {**band.model_dump(exclude_defaults=True), "type": "classic"}
        lines += ["", f"[[queues.{name}.bands]]"]
        lines += [f"{key} = {_toml(value)}" for key, value in fields.items()]
    return "\n".join(lines) + "\n"


@contextmanager
def classic_topology(base: str = "orders") -> Iterator[Path]:
    """A topology file: the current one plus `QUEUE`, with `base`'s bands made classic."""
    source = topology_path()
    text = source.read_text(encoding="utf-8")
    extra = section(load_topology(source).queue(base))
    descriptor, name = tempfile.mkstemp(prefix="bandgate-classic-", suffix=".toml")
    os.close(descriptor)
    path = Path(name)
    try:
        path.write_text(f"{text.rstrip()}\n\n{extra}", encoding="utf-8")
        load_topology(path)  # fails here, not in a worker, should the file be wrong
        yield path
    finally:
        path.unlink(missing_ok=True)


@contextmanager
def topology_env(path: Path) -> Iterator[None]:
    """`BANDGATE_TOPOLOGY` set to `path` meanwhile: for a worker process started in between."""
    before = os.environ.get(TOPOLOGY_ENV)
    os.environ[TOPOLOGY_ENV] = str(path)
    try:
        yield
    finally:
        if before is None:
            del os.environ[TOPOLOGY_ENV]
        else:
            os.environ[TOPOLOGY_ENV] = before

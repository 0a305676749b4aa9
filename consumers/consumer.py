"""A registered handler (`Consumer`), and what a worker needs of the app that holds them.

Both live below `consumers.app` so that the worker, the runner and the app can share them
without importing each other: `ConsumerApp.run()` starts a `Worker`, so the worker must not
import the app.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from bandgate.consumers.invoke import Handler, is_async
from bandgate.consumers.options import ConsumerOptions
from bandgate.consumers.settings import WorkerSettings
from bandgate.topology.model import QueueSpec, Topology


@dataclass(frozen=True)
class Consumer:
    """One registered handler with its queue and checked options."""

    handler: Handler
    spec: QueueSpec
    options: ConsumerOptions

    @property
    def name(self) -> str:
        handler = self.handler
        module = getattr(handler, "__module__", None)
        qualname = getattr(handler, "__qualname__", None) or repr(handler)
        return f"{module}.{qualname}" if module else qualname

    @cached_property
    def is_async(self) -> bool:
        # Cached: the worker asks on every message, and the answer never changes.
        return is_async(self.handler)


class Registry(Protocol):
    """The consumers a worker runs, with their settings and topology (`ConsumerApp` is one)."""

    @property
    def settings(self) -> WorkerSettings: ...

    @property
    def topology(self) -> Topology: ...

    @property
    def consumers(self) -> tuple[Consumer, ...]: ...


__all__ = ["Consumer", "Registry"]

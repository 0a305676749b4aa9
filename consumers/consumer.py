"""A consumer: a registered handler with its queue and its options, checked when the decorator
runs; and what a worker needs of the app that holds them (`Registry`).

They live below `bandgate.consumers.app` so that the worker, the runner and the app can share
them without importing each other: `ConsumerApp.run()` starts a `Worker`, so the worker must not
import the app. Keyword-only arguments already turn a misspelt option into a TypeError at
import; `check_options` catches the rest (an unknown queue or band, a bad value) with a message
naming the consumer.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol, cast

from pydantic import ValidationError

from bandgate.consumers.errors import ConfigurationError
from bandgate.consumers.message import Message
from bandgate.consumers.scheduling import POLICIES, PolicyName, default_prefetch, shard_prefetch
from bandgate.consumers.settings import WorkerSettings
from bandgate.topology.model import QueueSpec, RetryPolicy, Topology, UnknownQueueError

Handler = Callable[[Message], Any]


def is_async(handler: Handler) -> bool:
    """Whether calling `handler` returns an awaitable (coroutine functions, partials of them,
    objects with an async `__call__`)."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - an async __call__ is what we look for
    )


DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True)
class ConsumerOptions:
    queue: str
    concurrency: int = DEFAULT_CONCURRENCY
    policy: PolicyName = "strict"
    time_limit: float | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    prefetch_overrides: Mapping[str, int] = field(default_factory=dict)
    dedupe: bool = False
    hot_reserve: int = 0  # slots the coldest band never takes (`scheduling`, "Headroom")

    def prefetch(self, spec: QueueSpec, concurrency: int | None = None) -> tuple[int, ...]:
        """Prefetch per band (hottest first) at `concurrency` (default: the declared one); a
        sharded band's is split over its shards."""
        defaults = default_prefetch(self.policy, concurrency or self.concurrency, len(spec.bands))
        return tuple(
            self.prefetch_overrides.get(band.name, default)
            for band, default in zip(spec.bands, defaults, strict=True)
        )

    def held(self, spec: QueueSpec, concurrency: int | None = None) -> tuple[int, ...]:
        """The most messages per band (hottest first) a worker holds: a sharded band's prefetch
        is split over its shards, rounded up (`scheduling.shard_prefetch`); a fair band's
        noisy lane has the band's prefetch too."""
        return tuple(
            len(spec.band_queues(band)) * shard_prefetch(prefetch, band.shards)
            for band, prefetch in zip(spec.bands, self.prefetch(spec, concurrency), strict=True)
        )


def check_options(
    topology: Topology,
    queue: str,
    *,
    concurrency: Any,
    policy: Any,
    time_limit: Any,
    max_attempts: Any,
    max_deliveries: Any,
    prefetch: Any,
    dedupe: Any = False,
    hot_reserve: Any = 0,
) -> tuple[QueueSpec, ConsumerOptions]:
    """The queue's spec and the validated options; `ConfigurationError` on any problem."""
    where = f"@consumer({queue!r})"
    try:
        spec = topology.queue(queue)
    except UnknownQueueError:
        known = ", ".join(sorted(topology.queues)) or "none"
        raise ConfigurationError(
            f"{where}: the topology has no queue {queue!r} (queues: {known})"
        ) from None
    if not _is_int(concurrency) or concurrency < 1:
        raise ConfigurationError(
            f"{where}: concurrency must be an integer >= 1, not {concurrency!r}"
        )
    if policy not in POLICIES:
        raise ConfigurationError(
            f"{where}: policy must be one of {', '.join(POLICIES)}, not {policy!r}"
        )
    if time_limit is not None and (not _is_number(time_limit) or time_limit <= 0):
        raise ConfigurationError(f"{where}: time_limit must be seconds > 0, not {time_limit!r}")
    if not isinstance(dedupe, bool):
        raise ConfigurationError(f"{where}: dedupe must be True or False, not {dedupe!r}")
    if not _is_int(hot_reserve) or not 0 <= hot_reserve < concurrency:
        raise ConfigurationError(
            f"{where}: hot_reserve must be an integer from 0 to concurrency - 1 "
            f"({concurrency - 1}), not {hot_reserve!r}"
        )
    return spec, ConsumerOptions(
        queue=queue,
        concurrency=concurrency,
        policy=cast(PolicyName, policy),
        time_limit=None if time_limit is None else float(time_limit),
        retry=_retry_policy(where, spec.retry, max_attempts, max_deliveries),
        prefetch_overrides=_prefetch(where, spec, prefetch),
        dedupe=dedupe,
        hot_reserve=hot_reserve,
    )


def _retry_policy(
    where: str, base: RetryPolicy, max_attempts: Any, max_deliveries: Any
) -> RetryPolicy:
    overrides = {
        name: value
        for name, value in (("max_attempts", max_attempts), ("max_deliveries", max_deliveries))
        if value is not None
    }
    for name, value in overrides.items():
        if not _is_int(value):
            raise ConfigurationError(f"{where}: {name} must be an integer, not {value!r}")
    try:
        return RetryPolicy.model_validate({**base.model_dump(), **overrides})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc'])} {error['msg']}"
            for error in exc.errors()
        )
        raise ConfigurationError(f"{where}: {problems}") from None


def _prefetch(where: str, spec: QueueSpec, prefetch: Any) -> dict[str, int]:
    if prefetch is None:
        return {}
    if not isinstance(prefetch, Mapping):
        raise ConfigurationError(f"{where}: prefetch must map band names to counts")
    bands = [band.name for band in spec.bands]
    checked: dict[str, int] = {}
    for name, count in prefetch.items():
        if name not in bands:
            raise ConfigurationError(
                f"{where}: prefetch names band {name!r}, but {spec.name!r} has bands "
                f"{', '.join(bands)}"
            )
        if not _is_int(count) or count < 1:
            raise ConfigurationError(f"{where}: prefetch of band {name!r} must be >= 1")
        checked[name] = count
    return checked


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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


__all__ = [
    "DEFAULT_CONCURRENCY",
    "Consumer",
    "ConsumerOptions",
    "Handler",
    "Registry",
    "check_options",
    "is_async",
]

"""Consumer options, checked against the topology when the decorator runs.

Keyword-only arguments already turn a misspelt option into a TypeError at import; this module
catches the rest (an unknown queue or band, a bad value) with a message naming the consumer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import ValidationError

from bandgate.consumers.dispatch import POLICIES, PolicyName, default_prefetch, shard_prefetch
from bandgate.consumers.errors import ConfigurationError
from bandgate.topology.model import QueueSpec, RetryPolicy, Topology, UnknownQueueError

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
        is split over its shards, rounded up (`dispatch.shard_prefetch`)."""
        return tuple(
            band.shards * shard_prefetch(prefetch, band.shards)
            for band, prefetch in zip(spec.bands, self.prefetch(spec, concurrency), strict=True)
        )


def keeps_headroom(
    spec: QueueSpec, options: ConsumerOptions, prefetch: Sequence[int], idle_after: float
) -> bool:
    """Whether the coldest band of `spec` shares the slots through a headroom
    (`consumers.headroom`) under these options."""
    coldest = spec.bands[-1]
    return (
        idle_after > 0
        and options.policy == "strict"
        and len(spec.bands) > 1
        and coldest.shards == 1
        and not spec.ordered
        and coldest.name not in options.prefetch_overrides
        and prefetch[-1] < prefetch[0]
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
    return spec, ConsumerOptions(
        queue=queue,
        concurrency=concurrency,
        policy=cast(PolicyName, policy),
        time_limit=None if time_limit is None else float(time_limit),
        retry=_retry_policy(where, spec.retry, max_attempts, max_deliveries),
        prefetch_overrides=_prefetch(where, spec, prefetch),
        dedupe=dedupe,
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

"""The topology model: logical queues, their priority bands, retry and delay settings.

Frozen value objects, validated once when loaded; every other part of bandgate (gateway,
consumers, declarer, exporter, CLI) reads the same model.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from bandgate.topology import naming
from bandgate.topology.delay import DelayLadder
from bandgate.topology.priority import MAX_PRIORITY, MIN_PRIORITY

QueueType = Literal["quorum", "classic"]
FailureStrategy = Literal["skip", "block", "block_and_dlq"]
DEFAULT_FAILURE_STRATEGY: FailureStrategy = "block_and_dlq"

MAX_SHARDS = 64
# The one band a strictly serial queue gets when it names none.
SERIAL_BAND = "all"


def _name_of(kind: str) -> AfterValidator:
    """A validator for an object name the broker will see: `kind` says which in the error."""

    def check(name: str) -> str:
        if not naming.is_valid_name(name):
            raise ValueError(f"{kind} name {name!r} is invalid: {naming.NAME_RULE}")
        return name

    return AfterValidator(check)


BandName = Annotated[str, _name_of("band")]
QueueName = Annotated[str, _name_of("queue")]
ExchangeName = Annotated[str, _name_of("exchange")]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Band(_Frozen):
    """A contiguous priority range of one logical queue, stored in its own RabbitMQ queue."""

    name: BandName = Field(description="the band's name; its queue is <queue>.<name>")
    priorities: tuple[int, int] = Field(description="lowest and highest priority, inclusive")
    type: QueueType = Field(
        default="quorum",
        description="quorum (replicated) or classic (x-max-priority: exact priority order "
        "inside the band, not replicated)",
    )
    age_after_seconds: float | None = Field(
        default=None, gt=0, description="promote to the next band up after waiting this long"
    )
    max_length: int | None = Field(
        default=None,
        gt=0,
        description="messages the band holds at most; then publishes are refused "
        "(reject-publish: 429 queue_full)",
    )
    weight: float | None = Field(default=None, gt=0, description="share under `weighted`")
    shards: int = Field(
        default=1,
        ge=1,
        le=MAX_SHARDS,
        description="queues the band is spread over, by a consistent hash of the shard key",
    )
    fair: bool = Field(
        default=False,
        description="fair among tenants: a noisy tenant's messages go to a second queue, the "
        "noisy lane, which workers take after the band's own queue (docs/guides/tenants.md)",
    )

    @field_validator("priorities")
    @classmethod
    def _range_is_valid(cls, priorities: tuple[int, int]) -> tuple[int, int]:
        low, high = priorities
        for value in priorities:
            if not MIN_PRIORITY <= value <= MAX_PRIORITY:
                raise ValueError(f"priority {value} is out of range {MIN_PRIORITY}-{MAX_PRIORITY}")
        if low > high:
            raise ValueError(f"priorities [{low}, {high}] must be [lowest, highest]")
        return priorities

    @model_validator(mode="after")
    def _fair_is_one_queue(self) -> Band:
        if self.fair and self.shards != 1:
            raise ValueError(
                f"band {self.name!r} is fair and has shards = {self.shards}: a fair band is one "
                "queue and its noisy lane; remove shards or fair"
            )
        return self

    @property
    def low(self) -> int:
        return self.priorities[0]

    @property
    def high(self) -> int:
        return self.priorities[1]

    def covers(self, priority: int) -> bool:
        return self.low <= priority <= self.high


class RetryPolicy(_Frozen):
    """How failures are retried before a message is dead-lettered."""

    max_attempts: int = Field(
        default=5, ge=1, le=1000, description="failed attempts before the message is dead-lettered"
    )
    backoff_initial_seconds: float = Field(
        default=1.0, ge=0, description="the delay before the first retry"
    )
    backoff_multiplier: float = Field(default=2.0, ge=1, description="each next retry's factor")
    backoff_max_seconds: float = Field(
        default=300.0, ge=0, description="the longest delay between two attempts"
    )
    jitter: float = Field(default=0.1, ge=0, le=1, description="± fraction of each delay")
    max_deliveries: int = Field(
        default=5, ge=1, description="redeliveries (worker crashes) before dead-lettering"
    )

    def backoff_seconds(self, attempt: int) -> float:
        """Back-off after failed attempt number `attempt` (1-based), without jitter."""
        delay = self.backoff_initial_seconds * self.backoff_multiplier ** (attempt - 1)
        return float(min(delay, self.backoff_max_seconds))


def _span(low: int, high: int) -> str:
    return f"priority {low}" if low == high else f"priorities {low}-{high}"


def default_bands() -> tuple[Band, ...]:
    return (
        Band(name="hot", priorities=(7, 9)),
        Band(name="warm", priorities=(4, 6)),
        Band(name="cold", priorities=(0, 3)),
    )


class QueueSpec(_Frozen):
    """A logical queue: what producers name, split into bands hottest first.

    `ordered`: messages with one partition key are handled one at a time, in publish order,
    while they stay in one band: every band queue (each shard) has a single active consumer,
    and failures are retried in place as `failure_strategy` says. `ordering_required`: every
    message in publish order, one at a time, cluster-wide; implies `ordered`, one band (by
    default `all`, priorities 0-9) of one shard, and refuses `skip`.
    """

    name: QueueName = Field(description="the logical queue's name, from its [queues.<name>] key")
    bands: tuple[Band, ...] = Field(
        default_factory=default_bands,
        description="hottest first, covering 0-9 (default: hot 7-9, warm 4-6, cold 0-3)",
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="retries and back-off")
    ordered: bool = Field(
        default=False,
        description="per-key order: one active consumer per band queue, failures retried in place",
    )
    ordering_required: bool = Field(
        default=False,
        description="every message in publish order, one at a time, cluster-wide (one band)",
    )
    failure_strategy: FailureStrategy | None = Field(
        default=None,
        description="ordered queues: skip (dead-letter at the first failure), block (retry in "
        "place for ever) or block_and_dlq (the default: retry in place up to max_attempts, "
        "then dead-letter)",
    )

    @model_validator(mode="before")
    @classmethod
    def _serial_defaults(cls, data: Any) -> Any:
        """A strictly serial queue is ordered and, unless it names its bands, has one band."""
        if isinstance(data, dict) and data.get("ordering_required") is True:
            defaults = {"ordered": True, "bands": [{"name": SERIAL_BAND, "priorities": [0, 9]}]}
            data = {**defaults, **data}
        return data

    @model_validator(mode="after")
    def _bands_partition_priorities(self) -> QueueSpec:
        if not self.bands:
            raise ValueError("a queue needs at least one band")
        names = [band.name for band in self.bands]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"band names repeat: {', '.join(duplicates)}")
        if "dlq" in names:
            raise ValueError("'dlq' is reserved for the dead-letter queue")
        for upper, lower in zip(self.bands, self.bands[1:], strict=False):
            if lower.low > upper.high:
                raise ValueError(
                    f"band {lower.name!r} ({lower.low}-{lower.high}) is listed after band "
                    f"{upper.name!r} ({upper.low}-{upper.high}); list bands hottest first"
                )
        expected_high = MAX_PRIORITY
        for band in self.bands:
            if band.high > expected_high:
                raise ValueError(
                    f"band {band.name!r} ({band.low}-{band.high}) overlaps the band above it; "
                    "list bands hottest first with disjoint priority ranges"
                )
            if band.high < expected_high:
                raise ValueError(
                    f"no band covers {_span(band.high + 1, expected_high)} "
                    f"(gap above band {band.name!r}); bands must cover 0-9 without gaps"
                )
            expected_high = band.low - 1
        if expected_high >= MIN_PRIORITY:
            raise ValueError(
                f"no band covers {_span(MIN_PRIORITY, expected_high)}; bands must cover 0-9"
            )
        if self.bands[0].age_after_seconds is not None:
            raise ValueError(
                f"band {self.bands[0].name!r} is the hottest: there is no band to age into"
            )
        return self

    @model_validator(mode="after")
    def _ordering_is_consistent(self) -> QueueSpec:
        if self.failure_strategy is not None and not self.ordered:
            raise ValueError(
                "failure_strategy applies to ordered queues only: set ordered = true, or leave "
                "failure_strategy out (failures of other queues are retried through the delay "
                "exchanges)"
            )
        fair = [band.name for band in self.bands if band.fair]
        if fair and self.ordered:
            raise ValueError(
                f"band {fair[0]!r} is fair, but the queue is ordered: a tenant found noisy moves "
                "to the noisy lane, and its messages there would overtake or fall behind those "
                "of the same key in the band's queue; remove fair or ordered"
            )
        if not self.ordering_required:
            return self
        if not self.ordered:
            raise ValueError("ordering_required implies ordered: leave ordered out or set it true")
        if self.failure_strategy == "skip":
            raise ValueError(
                "failure_strategy 'skip' is refused with ordering_required: a skipped message "
                "lets later ones overtake it; use 'block' or 'block_and_dlq'"
            )
        if len(self.bands) != 1:
            names = ", ".join(repr(band.name) for band in self.bands)
            raise ValueError(
                f"ordering_required handles every message in publish order, so the queue has "
                f"one band covering priorities 0-9 (priorities would reorder it), not "
                f"{len(self.bands)} ({names}); leave bands out to get one named "
                f"{SERIAL_BAND!r}"
            )
        band = self.bands[0]
        if band.shards != 1:
            raise ValueError(
                f"band {band.name!r} has shards = {band.shards}, but ordering_required means "
                "one queue with one active consumer: remove shards"
            )
        return self

    def band_for(self, priority: int) -> Band:
        for band in self.bands:
            if band.covers(priority):
                return band
        raise ValueError(f"priority {priority} is in no band of {self.name!r}")  # unreachable

    def band(self, name: str) -> Band:
        for band in self.bands:
            if band.name == name:
                return band
        raise KeyError(f"queue {self.name!r} has no band {name!r}")

    @property
    def effective_failure_strategy(self) -> FailureStrategy:
        return self.failure_strategy or DEFAULT_FAILURE_STRATEGY

    def band_queues(self, band: Band) -> tuple[str, ...]:
        """The RabbitMQ queues holding `band`'s messages: its queue, or its shards in order;
        a fair band's queue and then its noisy lane."""
        if band.fair:
            return (
                naming.band_queue(self.name, band.name),
                naming.noisy_lane(self.name, band.name),
            )
        if band.shards == 1:
            return (naming.band_queue(self.name, band.name),)
        return tuple(naming.shard_queue(self.name, band.name, i) for i in range(band.shards))

    @property
    def shares_shards(self) -> bool:
        """Workers share the shards out among themselves: an ordered queue with a sharded band
        (each shard has one active consumer, and without sharing the first worker gets all)."""
        return self.ordered and any(band.shards > 1 for band in self.bands)

    def band_above(self, band: Band) -> Band | None:
        index = self.bands.index(band)
        return self.bands[index - 1] if index > 0 else None

    def weights(self) -> tuple[float, ...]:
        """Shares under the `weighted` policy; by default each band twice the one below."""
        count = len(self.bands)
        return tuple(
            band.weight if band.weight is not None else float(2 ** (count - 1 - index))
            for index, band in enumerate(self.bands)
        )


# The most levels a ladder may have; `topology.legacy` looks this far for an older ladder.
MAX_DELAY_LEVELS = 48


class DelaySettings(_Frozen):
    base_ms: int = Field(default=50, ge=1, description="TTL of delay level 0")
    # 26 levels of 50 ms reach 38.8 days: past the 30 days of Cloud Tasks (SQS stops at 15
    # minutes); each further level doubles the reach.
    levels: int = Field(
        default=26,
        ge=1,
        le=MAX_DELAY_LEVELS,
        description="levels of the delay ladder: level k holds base_ms x 2^k; 26 reach 38.8 days",
    )


class LedgerSettings(_Frozen):
    """Retention of the tombstone ledger (`core.ledger`): a cancel or replace applies to the
    copies consumed within this window after it was written, and workers keep in memory what
    the window holds. The broker drops whole segments, oldest first, once either limit is hit."""

    max_age_seconds: int = Field(
        default=7 * 24 * 3600, ge=60, description="how long a tombstone is kept (default 7 days)"
    )
    max_bytes: int = Field(
        default=128 << 20,
        ge=1 << 20,
        description="the most the ledger stream keeps on disk (an entry takes about 290 bytes "
        "there, and about 260 in the memory of every worker and receiving gateway process)",
    )

    @property
    def segment_bytes(self) -> int:
        """A stream is trimmed a segment at a time: ten segments per `max_bytes`, at most the
        broker's default of 500 MB."""
        return max(1 << 20, min(500_000_000, self.max_bytes // 10))


class UnknownQueueError(KeyError):
    """A queue name that the topology does not define."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown queue {self.name!r}"


class Topology(_Frozen):
    """Everything declared on the broker for one bandgate deployment."""

    exchange: ExchangeName = Field(
        default="bandgate", description="the topic exchange that routes <queue>.<priority>"
    )
    delay: DelaySettings = Field(default_factory=DelaySettings, description="the delay ladder")
    ledger: LedgerSettings = Field(
        default_factory=LedgerSettings, description="retention of the tombstone ledger"
    )
    queues: dict[str, QueueSpec] = Field(default_factory=dict, description="the logical queues")

    @model_validator(mode="before")
    @classmethod
    def _queue_names_from_keys(cls, data: object) -> object:
        """`[queues.orders]` in TOML names the queue `orders`; fill `name` from the key."""
        if isinstance(data, dict) and isinstance(data.get("queues"), dict):
            queues = {}
            for key, spec in data["queues"].items():
                if isinstance(spec, dict):
                    spec = {"name": key, **spec}
                    if spec["name"] != key:
                        raise ValueError(f"queue {key!r} has a different name {spec['name']!r}")
                queues[key] = spec
            data = {**data, "queues": queues}
        return data

    @property
    def ladder(self) -> DelayLadder:
        return DelayLadder(self.exchange, self.delay.base_ms, self.delay.levels)

    def queue(self, name: str) -> QueueSpec:
        try:
            return self.queues[name]
        except KeyError:
            raise UnknownQueueError(name) from None

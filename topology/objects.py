"""The RabbitMQ objects a topology needs, as plain values.

`plan()` turns the model into exchanges, queues and bindings; the declarer applies them over
AMQP and the exporter writes them as definitions.json, so both always agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypedDict

from bandgate.topology import naming, wire
from bandgate.topology.model import Band, QueueSpec, Topology

QueueArguments = TypedDict(
    "QueueArguments",
    {
        "x-queue-type": str,
        "x-max-priority": int,
        "x-message-ttl": int,
        "x-max-length": int,
        "x-overflow": str,
        "x-dead-letter-exchange": str,
        "x-dead-letter-routing-key": str,
        "x-dead-letter-strategy": str,
        "x-single-active-consumer": bool,
        "x-max-age": str,
        "x-max-length-bytes": int,
        "x-stream-max-segment-size-bytes": int,
        "x-queue-leader-locator": str,
    },
    total=False,
)
ExchangeType = Literal["topic", "direct", "x-consistent-hash"]

# Where a new replicated queue's leader goes: the node leading the fewest (`balanced`, since
# 3.10), not the node the declaring client happens to be connected to (`client-local`, the
# default), which put every leader of a topology applied through one node on that node.
# An argument rather than a policy: a queue takes one policy, so ours would displace the
# operator's own (or be displaced). RabbitMQ checks it on every declare, so a queue declared
# before it was set is declared again without it (`topology.declare`) and its leader moved by
# `rabbitmq-queues rebalance all` (README, "Running on a cluster").
LEADER_LOCATOR_ARG: Literal["x-queue-leader-locator"] = "x-queue-leader-locator"
LEADER_LOCATOR = "balanced"
REPLICATED_TYPES = ("quorum", "stream")

# Every shard gets the same weight (one bucket of the consistent hash).
SHARD_WEIGHT = "1"


@dataclass(frozen=True)
class ExchangeDecl:
    name: str
    type: ExchangeType
    arguments: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueDecl:
    name: str
    arguments: QueueArguments = field(default_factory=lambda: QueueArguments())

    @property
    def replicated(self) -> bool:
        return self.arguments.get("x-queue-type") in REPLICATED_TYPES

    def without_placement(self) -> QueueDecl:
        """This queue as declared before bandgate placed leaders."""
        arguments = QueueArguments(**self.arguments)
        arguments.pop("x-queue-leader-locator", None)
        return QueueDecl(self.name, arguments)


@dataclass(frozen=True)
class BindingDecl:
    source: str
    destination: str
    routing_key: str
    destination_type: Literal["queue", "exchange"] = "queue"


@dataclass(frozen=True)
class Plan:
    exchanges: tuple[ExchangeDecl, ...]
    queues: tuple[QueueDecl, ...]
    bindings: tuple[BindingDecl, ...]


def band_arguments(topology: Topology, queue: QueueSpec, band: Band) -> QueueArguments:
    """Arguments of a band's queue.

    A band with an aging threshold dead-letters expired messages into the band above it (by
    routing key, through the main exchange), so the broker itself promotes starving messages.
    Other bands dead-letter into the queue's DLQ, so a message rejected by any client is
    kept, not dropped. Quorum bands dead-letter at-least-once, which needs reject-publish.
    """
    args = QueueArguments()
    args["x-queue-type"] = band.type
    args["x-overflow"] = "reject-publish"
    above = queue.band_above(band)
    if band.age_after_seconds is not None and above is not None:
        args["x-message-ttl"] = int(band.age_after_seconds * 1000)
        args["x-dead-letter-exchange"] = topology.exchange
        args["x-dead-letter-routing-key"] = naming.routing_key(queue.name, above.low)
    else:
        args["x-dead-letter-exchange"] = naming.dead_letter_exchange(topology.exchange)
        args["x-dead-letter-routing-key"] = queue.name
    if band.type == "quorum":
        args["x-dead-letter-strategy"] = "at-least-once"
    else:
        # Classic queues order by priority inside the band; quorum queues refuse this on 3.x.
        args["x-max-priority"] = band.high
    if band.max_length is not None:
        args["x-max-length"] = band.max_length
    if queue.ordered:
        # One consumer in the cluster at a time; when it goes, its unacked messages return to
        # the head of the queue before the next consumer gets any, so order holds.
        args["x-single-active-consumer"] = True
    return args


def shard_exchange(topology: Topology, queue: QueueSpec, band: Band) -> ExchangeDecl:
    """A sharded band's consistent-hash exchange, hashing the shard key every message carries."""
    return ExchangeDecl(
        naming.shard_exchange(topology.exchange, queue.name, band.name),
        "x-consistent-hash",
        {"hash-header": wire.SHARD_KEY},
    )


def _quorum() -> QueueArguments:
    return QueueArguments({"x-queue-type": "quorum"})


def ledger_arguments(topology: Topology) -> QueueArguments:
    """The ledger is a stream: replicated like the bands, read from any offset by every
    worker, and trimmed by the broker itself (age and size, a segment at a time)."""
    ledger = topology.ledger
    args = QueueArguments({"x-queue-type": "stream"})
    args["x-max-age"] = f"{ledger.max_age_seconds}s"
    args["x-max-length-bytes"] = ledger.max_bytes
    args["x-stream-max-segment-size-bytes"] = ledger.segment_bytes
    return args


def plan(topology: Topology) -> Plan:
    exchange = topology.exchange
    dead = naming.dead_letter_exchange(exchange)
    ladder = topology.ladder
    exit_exchange = naming.delay_exit_exchange(exchange)

    exchanges = [
        ExchangeDecl(exchange, "topic"),
        ExchangeDecl(dead, "direct"),
        ExchangeDecl(exit_exchange, "topic"),
    ]
    queues = [QueueDecl(naming.ledger_stream(exchange), ledger_arguments(topology))]
    bindings: list[BindingDecl] = []

    for level in range(ladder.levels):
        name = naming.delay_level(exchange, level)
        exchanges.append(ExchangeDecl(name, "topic"))
        args = _quorum()
        args["x-message-ttl"] = ladder.ttl_ms(level)
        args["x-overflow"] = "reject-publish"
        args["x-dead-letter-exchange"] = ladder.next_hop(level)
        args["x-dead-letter-strategy"] = "at-least-once"
        queues.append(QueueDecl(name, args))
        bindings.append(BindingDecl(name, name, ladder.bit_pattern(level, "1")))
        bindings.append(
            BindingDecl(name, ladder.next_hop(level), ladder.bit_pattern(level, "0"), "exchange")
        )

    for spec in topology.queues.values():
        for band in spec.bands:
            arguments = band_arguments(topology, spec, band)
            band_queues = spec.band_queues(band)
            queues += [QueueDecl(name, arguments) for name in band_queues]
            # The band's priorities route to its queue, or to its hash exchange in front of
            # its shards (messages for it arrive through the main exchange and the delay exit).
            target: str = band_queues[0]
            kind: Literal["queue", "exchange"] = "queue"
            if band.shards > 1:
                hashing = shard_exchange(topology, spec, band)
                exchanges.append(hashing)
                target, kind = hashing.name, "exchange"
                bindings += [BindingDecl(target, name, SHARD_WEIGHT) for name in band_queues]
            for priority in range(band.low, band.high + 1):
                key = naming.routing_key(spec.name, priority)
                bindings.append(BindingDecl(exchange, target, key, kind))
                pattern = naming.delay_exit_pattern(spec.name, priority)
                bindings.append(BindingDecl(exit_exchange, target, pattern, kind))
                if band.fair:  # only a publish that found its tenant noisy routes here
                    noisy = naming.noisy_routing_key(spec.name, priority)
                    bindings.append(BindingDecl(exchange, band_queues[1], noisy))
                    exit_noisy = naming.delay_exit_pattern(spec.name, priority, noisy=True)
                    bindings.append(BindingDecl(exit_exchange, band_queues[1], exit_noisy))
        dlq = naming.dead_letter_queue(spec.name)
        queues.append(QueueDecl(dlq, _quorum()))
        bindings.append(BindingDecl(dead, dlq, spec.name))
        if spec.shares_shards:
            queues.append(QueueDecl(naming.workers_queue(exchange, spec.name), _quorum()))

    placed = tuple(_placed(queue) for queue in queues)
    return Plan(tuple(exchanges), placed, tuple(bindings))


def _placed(queue: QueueDecl) -> QueueDecl:
    if not queue.replicated:
        return queue
    arguments = QueueArguments(**queue.arguments)
    arguments["x-queue-leader-locator"] = LEADER_LOCATOR
    return QueueDecl(queue.name, arguments)


def replicated_queues(topology: Topology) -> tuple[str, ...]:
    """Names of the topology's replicated queues (quorum and stream), in declaration order."""
    return tuple(queue.name for queue in plan(topology).queues if queue.replicated)

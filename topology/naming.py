"""Every RabbitMQ object name bandgate uses, from one place.

The gateway, the consumers, the exported definitions and the tests all call these functions,
so they cannot disagree about what a band, a dead-letter queue or a delay level is called.
Queue and band names never contain dots, which keeps routing keys unambiguous: the last two
words of any bandgate routing key are always `<queue>.<priority>`.

Queues that bandgate keeps for itself (the delay ladder, workers queues) start with
`INTERNAL_PREFIX`, `zz.`: the management UI lists queues sorted by name, byte by byte, so they
come after the bands of every logical queue whose name does not itself start with `zz`.
"""

from __future__ import annotations

import re

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
NAME_RULE = "1-64 characters: letters, digits, '-' and '_', starting with a letter or digit"

GATEWAY_CONNECTION = "bandgate-gateway"
WORKER_CONNECTION = "bandgate-worker"
CLI_CONNECTION = "bandgate-cli"
PRODUCER_CONNECTION = "bandgate-producer"


# AMQP 0-9-1 names may hold only [a-zA-Z0-9-_.:] (pamqp, under aio-pika, refuses a `~`, which
# would sort after everything), and `z` is the last of those in byte order.
INTERNAL_PREFIX = "zz."


def is_valid_name(name: str) -> bool:
    return bool(NAME_PATTERN.fullmatch(name))


def routing_key(queue: str, priority: int) -> str:
    """Key a message for `queue` at `priority` is published with on the main exchange."""
    return f"{queue}.{priority}"


def band_queue(queue: str, band: str) -> str:
    """The queue of a band of one shard (the default)."""
    return f"{queue}.{band}"


def shard_queue(queue: str, band: str, shard: int) -> str:
    """Shard `shard` (0-based) of a sharded band."""
    return f"{queue}.{band}.{shard}"


# The last word of a routing key that sends a message of a fair band to its noisy lane, after
# `<queue>.<priority>`: a key's last word is otherwise a priority digit, so neither a band's
# binding (`<queue>.<priority>`) nor its delay exit (`#.<queue>.<priority>`) takes it.
NOISY_LANE_WORD = "noisy"


def noisy_lane(queue: str, band: str) -> str:
    """The second queue of a `fair` band: the messages of the tenants found noisy while
    publishing wait here, out of the quiet tenants' way (`core.fairness`)."""
    return f"{queue}.{band}.{NOISY_LANE_WORD}"


def noisy_routing_key(queue: str, priority: int) -> str:
    """Key a noisy tenant's message for `queue` at `priority` goes to its band's noisy lane with."""
    return f"{routing_key(queue, priority)}.{NOISY_LANE_WORD}"


def shard_exchange(exchange: str, queue: str, band: str) -> str:
    """Consistent-hash exchange spreading a sharded band's messages over its shard queues.

    The word `shards` keeps it apart from every other name under the deployment's exchange
    (`<exchange>.dead`, and the legacy `<exchange>.delay.NN` and `<exchange>.delay.out`).
    """
    return f"{exchange}.shards.{queue}.{band}"


def workers_queue(exchange: str, queue: str) -> str:
    """Queue that holds no messages: every worker of `queue` consumes it, so its consumer count
    is the number of workers (ordered sharded queues share their shards out by it)."""
    return _internal(legacy_workers_queue(exchange, queue))


def replica_mailbox(exchange: str, replica: str) -> str:
    """Exclusive queue of one gateway process serving HTTP receivers (`bandgate.pull`): the
    settlements of its leases that reach other processes are forwarded to it here. The broker
    deletes it when that process's connection goes, which is how the others learn it is gone."""
    return _internal(f"{exchange}.replica.{replica}")


def ledger_stream(exchange: str) -> str:
    """The stream of tombstones (cancelled and superseded messages, handled ids) every worker
    and HTTP receiver of the deployment follows (`core.ledger`)."""
    return _internal(f"{exchange}.ledger")


def dead_letter_queue(queue: str) -> str:
    return f"{queue}.dlq"


def dead_letter_lock(queue: str) -> str:
    """Auto-delete queue whose one exclusive consumer is the dead-letter operation (list,
    replay, purge) running on `<queue>.dlq`: a mutex the broker releases by itself when that
    consumer, its channel or its connection goes. It exists only while an operation runs."""
    return f"{dead_letter_queue(queue)}.lock"


def dead_letter_exchange(exchange: str) -> str:
    """Direct exchange routing `<queue>` to `<queue>.dlq`."""
    return f"{exchange}.dead"


def delay_level(exchange: str, level: int) -> str:
    """Name of delay level `level`: a topic exchange and the TTL queue bound behind it."""
    return _internal(legacy_delay_level(exchange, level))


def delay_exit_exchange(exchange: str) -> str:
    """Topic exchange where the delay ladder ends; it routes `#.<queue>.<priority>` to bands."""
    return _internal(legacy_delay_exit_exchange(exchange))


def delayed_routing_key(bits: str, queue: str, priority: int, *, noisy: bool = False) -> str:
    """Routing key of a delayed message: one word per delay level, then the normal key (the
    noisy lane's, for a noisy tenant of a fair band)."""
    key = noisy_routing_key(queue, priority) if noisy else routing_key(queue, priority)
    return f"{bits}.{key}"


def delay_exit_pattern(queue: str, priority: int, *, noisy: bool = False) -> str:
    """Where the delay ladder's exit sends a key to: the band (or its noisy lane)."""
    key = noisy_routing_key(queue, priority) if noisy else routing_key(queue, priority)
    return f"#.{key}"


def _internal(name: str) -> str:
    return f"{INTERNAL_PREFIX}{name}"


# The legacy rule: what bandgate called its internal objects before they took INTERNAL_PREFIX.
# A deployment applied by an older version still has them; `topology.legacy` finds them by these
# names (the doctor reports them, `bandgate topology prune` removes them once they are empty).


def legacy_delay_level(exchange: str, level: int) -> str:
    return f"{exchange}.delay.{level:02d}"


def legacy_delay_exit_exchange(exchange: str) -> str:
    return f"{exchange}.delay.out"


def legacy_workers_queue(exchange: str, queue: str) -> str:
    return f"{exchange}.workers.{queue}"

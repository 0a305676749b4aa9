"""What a three-node cluster spends per message of bandgate's traffic: the figures the sizing
model (docs/sizing.md) is built from.

A local cluster of three private nodes, each Erlang VM with busy waiting off, as every private
node's (`NO_BUSY_WAIT` in `bandgate.ops.local_broker`: an idle scheduler then costs nothing, so
a node's CPU time is its work, not its spinning). One band, a quorum queue of three members;
the client connects to a node that follows it, so the three nodes play three parts: the
leader's node, the client's node (a follower plus the AMQP connection and channel) and the
other follower. Per message:
- `publish`: published through bandgate's Publisher, `IN_FLIGHT` confirms pipelined, then
  eight times as many;
- `consume`: delivered to an aio-pika consumer (prefetch `IN_FLIGHT`, then eight times as
  many) and acked one by one;
- `delayed`: published due in one ladder step, so it passes one delay level (a quorum queue
  whose TTL dead-letters it, at least once, into the band): `delayed - publish` is a hop.
Each for 1 KiB and 10 KiB bodies, `ROUNDS` rounds interleaved; each figure is the median over
the rounds, every round's beside it.

Figures, per message, in µs of CPU unless named otherwise:
- `cluster_us`: the three nodes together; `leader_us`, `follower_us`: the leader's node and the
  other follower's; `client_us`: the client's node less a follower's, i.e. what terminating AMQP
  costs;
- `ra_leader_us`, `wal_us`: the leader's Ra process and the leader node's WAL writer, estimated
  as the node's CPU times that process's share of the node's reductions (Erlang's unit of work;
  the WAL's file writes on dirty I/O schedulers count no reductions, so `wal_us` is a floor);
- `disk_kib`: bytes written per node (Linux's `write_bytes`, page-grained), leader's node;
- `rate`: messages per second; on two cores shared by three nodes and the client, a floor.
The run ends with `disk_total_kib`: every node's writes over the whole run per message-copy
written, which also counts the segment files the WAL is flushed into after it rolls over.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.ops.local_broker import LocalBroker
from bandgate.topology import naming, wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bench.environment import cpu_seconds, wait_for_quiet, written_bytes
from bench.rounds import ROUNDS
from tools.broker_roots import root_for
from tools.local_cluster import LocalCluster

QUEUE = "sizing"
BAND = naming.band_queue(QUEUE, "all")
SIZES = {1024: 20_000, 10_240: 5_000}  # body bytes -> messages per phase
IN_FLIGHT = 64
# Each phase and the confirms (prefetch) it keeps in flight: the deeper runs show how much of a
# message's cost is per batch (a WAL write, an fsync, a confirm) rather than per message.
PHASES = (
    ("publish", IN_FLIGHT),
    ("consume", IN_FLIGHT),
    ("publish", 8 * IN_FLIGHT),
    ("consume", 8 * IN_FLIGHT),
    ("delayed", IN_FLIGHT),
)
TOPOLOGY = parse_topology(
    {
        "exchange": "bench-sizing",
        "delay": {"levels": 2},
        "queues": {QUEUE: {"bands": [{"name": "all", "priorities": [0, 9]}]}},
    }
)
# On every node: this node's member of the band (leader or follower), its WAL writer, and the
# node's total reductions. A tuple, so that the shell prints numbers, never a string.
REDUCTIONS = """
Of = fun(undefined) -> 0;
        (P) -> case erlang:process_info(P, reductions) of {reductions, R} -> R; _ -> 0 end
     end,
{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"%s">>)),
{RaName, _} = amqqueue:get_pid(Q),
{Total, _} = erlang:statistics(exact_reductions),
{Total, Of(whereis(RaName)), Of(whereis(ra_log_wal))}.
"""


@dataclass
class Sample:
    """One node's counters at one moment."""

    cpu: float
    written: int
    reductions: tuple[int, int, int]  # node total, the band's member, the WAL writer


def run_cluster(version: str | None) -> list[dict[str, Any]]:
    """Start a three-node cluster of `version` (default: the installed RabbitMQ) and measure."""
    root = root_for(version) if version else None
    with tempfile.TemporaryDirectory(prefix="bandgate-bench-cluster-") as tmp:
        cluster = LocalCluster(
            Path(tmp),
            plugins=("rabbitmq_consistent_hash_exchange",),
            root=root,
        )
        try:
            cluster.start()
            return asyncio.run(_measure(cluster))
        finally:
            cluster.stop()


async def _measure(cluster: LocalCluster) -> list[dict[str, Any]]:
    setup = await aio_pika.connect_robust(cluster.nodes[0].amqp_url)
    await apply_topology(setup, TOPOLOGY)
    await setup.close()
    leader = cluster.by_name(cluster.leader_of(BAND))
    client, other = [node for node in cluster.nodes if node is not leader]
    roles = {"leader": leader, "client": client, "follower": other}
    connection = await aio_pika.connect_robust(client.amqp_url)
    publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
    start = {name: _sample(node) for name, node in roles.items()}
    copies = 0  # messages written into a replicated queue, on each node
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(ROUNDS):
        for size, count in SIZES.items():
            body = "x" * (size - 2)  # a JSON string: two quotes around it
            for phase, in_flight in PHASES:
                wait_for_quiet(patience=5.0)
                if phase == "publish":
                    work = _publish(publisher, body, count, in_flight=in_flight)
                elif phase == "consume":
                    work = _consume(connection, count, in_flight)
                else:
                    work = _publish_delayed(publisher, connection, body, count)
                label = f"{phase} {size // 1024} KiB" + (
                    f", {in_flight} in flight" if in_flight != IN_FLIGHT else ""
                )
                runs.setdefault(label, []).append(await _phase(roles, count, work))
            await _consume(connection, count, IN_FLIGHT)  # the delayed ones: the band is empty
            copies += 5 * count  # the band four times, the delay level once
    await connection.close()
    end = {name: _sample(node) for name, node in roles.items()}
    rows = [_median_row(label, done) for label, done in runs.items()]
    written = statistics.median(end[name].written - start[name].written for name in roles)
    rows.append({"name": "disk_total_kib per message-copy", "disk_kib": written / copies / 1024})
    return rows


async def _phase(
    roles: dict[str, LocalBroker], count: int, work: Coroutine[Any, Any, None]
) -> dict[str, float]:
    before = {name: _sample(node) for name, node in roles.items()}
    started = time.perf_counter()
    await work
    elapsed = time.perf_counter() - started
    after = {name: _sample(node) for name, node in roles.items()}

    def per_message(name: str) -> float:
        return (after[name].cpu - before[name].cpu) / count * 1e6

    def share(name: str, which: int) -> float:
        total = after[name].reductions[0] - before[name].reductions[0]
        part = after[name].reductions[which] - before[name].reductions[which]
        return per_message(name) * part / total if total else float("nan")

    return {
        "cluster_us": sum(per_message(name) for name in roles),
        "leader_us": per_message("leader"),
        "follower_us": per_message("follower"),
        "client_us": per_message("client") - per_message("follower"),
        "ra_leader_us": share("leader", 1),
        "wal_us": share("leader", 2),
        "disk_kib": (after["leader"].written - before["leader"].written) / count / 1024,
        "rate": count / elapsed,
    }


def _median_row(label: str, runs: list[dict[str, float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"name": label}
    for key in runs[0]:
        row[key] = statistics.median(run[key] for run in runs)
    row["cluster_us_runs"] = "/".join(f"{run['cluster_us']:.0f}" for run in runs)
    return row


def _sample(node: LocalBroker) -> Sample:
    assert node.process is not None
    output = node.ctl("eval", REDUCTIONS % BAND)
    total, member, wal = (int(n) for n in re.findall(r"\d+", output)[:3])
    pid = node.process.pid
    return Sample(cpu_seconds(pid), written_bytes(pid), (total, member, wal))


async def _publish(
    publisher: Publisher,
    body: str,
    count: int,
    *,
    delayed: bool = False,
    in_flight: int = IN_FLIGHT,
) -> None:
    # One and a half steps: whatever a message's time to the publish, it rounds to one step or
    # two, each of which is one level of the ladder, so one hop.
    step = timedelta(milliseconds=TOPOLOGY.delay.base_ms * 1.5)
    for first in range(0, count, in_flight):
        envelopes = [
            wire.Envelope(
                queue=QUEUE,
                payload=body,
                priority=4,
                deliver_at=wire.now() + step if delayed else None,
            )
            for _ in range(min(in_flight, count - first))
        ]
        for result in await publisher.publish_many(envelopes):
            if isinstance(result, Exception):
                raise result


async def _publish_delayed(
    publisher: Publisher, connection: AbstractRobustConnection, body: str, count: int
) -> None:
    """Publish through one delay level; return once every message is in the band."""
    await _publish(publisher, body, count, delayed=True)
    while True:
        # A channel per look: passive declares repeated on one channel kept answering 0 on
        # 3.10.8 while the band held every message.
        async with await connection.channel() as channel:
            queue = await channel.declare_queue(BAND, passive=True)
        if (queue.declaration_result.message_count or 0) >= count:
            return
        await asyncio.sleep(0.05)


async def _consume(connection: AbstractRobustConnection, count: int, in_flight: int) -> None:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=in_flight)
    done = asyncio.Event()
    received = 0

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal received
        await message.ack()
        received += 1
        if received == count:
            done.set()

    queue = await channel.get_queue(BAND)
    tag = await queue.consume(on_message)
    await done.wait()
    await queue.cancel(tag)
    await channel.close()

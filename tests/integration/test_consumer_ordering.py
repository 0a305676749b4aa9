"""Ordered and sharded bands on a real broker: per-key order over three worker processes (and
with one of them SIGKILLed), a poison message under `block_and_dlq`, and a strictly serial
queue with three workers running.

The worker processes import this module for its `app`; its handlers write one line per event to
the file named by BANDGATE_TEST_RECORD, which the tests read back.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import ATTEMPTS, FAILURE_CAUSE, PARTITION_KEY, Envelope
from tests.integration.test_consumer_process import RECORD_ENV, Event, Workers, by_event, exited

pytestmark = pytest.mark.integration

SHARDS = 6
KEYS = [f"customer-{n:02d}" for n in range(20)]
PER_KEY = 50

TOPOLOGY = parse_topology(
    {
        "delay": {"base_ms": 50, "levels": 4},
        "queues": {
            "orders": {
                "ordered": True,
                "retry": {"max_attempts": 3, "backoff_initial_seconds": 0.2},
                "bands": [
                    {"name": "hot", "priorities": [5, 9], "shards": SHARDS},
                    {"name": "cold", "priorities": [0, 4]},
                ],
            },
            "commands": {"ordering_required": True},
        },
    }
)

# What the worker processes run; settings from their environment, the topology given.
app = ConsumerApp(topology=TOPOLOGY)


# A sharded band's prefetch is split over its shards: 24 is 4 per shard, so a worker holding
# two of the six shards still has work at hand for its 4 slots.
@app.consumer("orders", concurrency=4, prefetch={"hot": 24})
async def handle_order(msg: Message) -> None:
    if msg.payload.get("warmup"):
        record("warmup", msg)
        return
    record("start", msg)
    await asyncio.sleep(msg.payload["sleep"])
    record("end", msg)


@app.consumer("commands")
async def handle_command(msg: Message) -> None:
    record("start", msg)
    await asyncio.sleep(msg.payload["sleep"])
    record("end", msg)


def record(event: str, msg: Message) -> None:
    line = json.dumps(
        {
            "event": event,
            "queue": msg.queue,
            "key": msg.partition_key,
            "seq": msg.payload.get("seq"),
            "pid": os.getpid(),
            "at": time.time(),
        }
    )
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as out:
        out.write(line + "\n")


@pytest.fixture
def workers(amqp_url: str, tmp_path: Path) -> Iterator[Workers]:
    running = Workers(
        amqp_url,
        tmp_path / "record.jsonl",
        target=f"{__name__}:app",
        env={"BANDGATE_SHARE_SHARDS_SECONDS": "0.5"},
    )
    yield running
    for process in running.processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
async def connection(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        yield connection


@pytest.fixture
async def publisher(connection: AbstractRobustConnection) -> AsyncIterator[Publisher]:
    publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
    yield publisher
    await publisher.channels.close()


async def publish_keyed(
    connection: AbstractRobustConnection, seqs: Iterable[int], rng: random.Random
) -> None:
    """Every key's messages `seqs`, with random handler times of 10-50 ms. Each key has a
    channel of its own and its messages go out on it one after the other without waiting for
    the confirms (a channel keeps the order of what it sends), all keys at once."""
    sleeps = {(key, seq): rng.uniform(0.01, 0.05) for key in KEYS for seq in seqs}

    async def one_key(key: str) -> None:
        channels = ChannelSet(confirm_channel_factory(connection), size=1)
        publisher = Publisher(TOPOLOGY, channels)
        envelopes = [
            Envelope(
                queue="orders",
                payload={"seq": seq, "sleep": sleeps[key, seq]},
                priority=7,
                partition_key=key,
            )
            for seq in seqs
        ]
        await channels.get()  # open it first: the publishes then queue up in order
        results = await asyncio.gather(*(publisher.publish(e) for e in envelopes))
        assert all(isinstance(result, Published) for result in results)
        await channels.close()

    await asyncio.gather(*(one_key(key) for key in KEYS))


async def workers_joined(connection: AbstractRobustConnection, count: int) -> None:
    """Wait until `count` workers consume the queue's workers queue (all their shards are
    subscribed by then)."""
    channel = await connection.channel()
    underlay = await channel.get_underlay_channel()  # aio-pika's own declare repeats itself
    name = naming.workers_queue(TOPOLOGY.exchange, "orders")
    deadline = time.monotonic() + 30
    while True:
        declared = await underlay.queue_declare(name, passive=True)
        if declared.consumer_count == count:
            break
        assert time.monotonic() < deadline, f"{count} workers did not join within 30 s"
        await asyncio.sleep(0.1)
    await channel.close()


async def share_out(publisher: Publisher, workers: Workers, count: int) -> float:
    """Send rounds of unkeyed messages (spread over all shards) until each of `count` workers
    handles a fair part of a round: the workers have shared the shards out. Seconds it took."""
    started = time.monotonic()
    for round_ in range(40):
        results = await publisher.publish_many(
            [Envelope(queue="orders", payload={"warmup": True}, priority=7) for _ in range(60)]
        )
        assert all(isinstance(result, Published) for result in results)
        await workers.wait_for("the warm-up round", warmed_up(60 * (round_ + 1)))
        last = by_event(workers.events(), "warmup")[-60:]
        shares = Counter(entry["pid"] for entry in last)
        if len(shares) == count and min(shares.values()) >= 60 / SHARDS:
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    raise AssertionError(f"the workers did not share the shards out: {shares}")


def warmed_up(count: int) -> Callable[[list[Event]], bool]:
    return lambda events: len(by_event(events, "warmup")) >= count


def order_violations(events: list[Event]) -> tuple[int, int]:
    """(starts out of order, starts while the key's previous message still ran), over keys.

    A start is in order when its seq is the key's next one after the last finished, or that
    last one again (a message re-run after its worker died before the ack). A start that never
    finished (its worker was killed) does not block the key.
    """
    finished = {(e["pid"], e["key"], e["seq"]) for e in events if e["event"] == "end"}
    done: dict[str, int] = defaultdict(lambda: -1)
    running: dict[str, int] = defaultdict(int)
    out_of_order = overlapping = 0
    for event in sorted(events, key=lambda e: e["at"]):
        key, seq = event["key"], event["seq"]
        if event["event"] == "start":
            if seq not in (done[key], done[key] + 1):
                out_of_order += 1
            if (event["pid"], key, seq) in finished:
                running[key] += 1
                overlapping += running[key] > 1
        elif event["event"] == "end":
            done[key] = max(done[key], seq)
            running[key] -= 1
    return out_of_order, overlapping


def burst_seconds(events: list[Event], seqs: range) -> float:
    mine = [e for e in events if e["event"] in ("start", "end") and e["seq"] in seqs]
    return float(max(e["at"] for e in mine) - min(e["at"] for e in mine))


def all_finished(seqs: range) -> Callable[[list[Event]], bool]:
    wanted = {(key, seq) for key in KEYS for seq in seqs}

    def check(events: list[Event]) -> bool:
        return wanted <= {(e["key"], e["seq"]) for e in by_event(events, "end")}

    return check


async def stop(workers: Workers) -> None:
    running = [process for process in workers.processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    for process in running:
        assert await asyncio.to_thread(exited, process) == 0


async def test_per_key_order_holds_over_three_workers_sharing_the_shards(
    connection: AbstractRobustConnection, publisher: Publisher, workers: Workers
) -> None:
    rng = random.Random(7)
    workers.start()
    await workers_joined(connection, 1)
    alone = range(0, PER_KEY)
    await publish_keyed(connection, alone, rng)
    await workers.wait_for("one worker's burst", all_finished(alone), seconds=60)

    workers.start()
    workers.start()
    await workers_joined(connection, 3)
    shared_after = await share_out(publisher, workers, 3)
    together = range(PER_KEY, 2 * PER_KEY)
    await publish_keyed(connection, together, rng)
    await workers.wait_for("three workers' burst", all_finished(together), seconds=60)
    await stop(workers)

    events = workers.events()
    one, three = burst_seconds(events, alone), burst_seconds(events, together)
    out_of_order, overlapping = order_violations(events)
    pids = Counter(e["pid"] for e in by_event(events, "end") if e["seq"] in together)
    print(
        f"{len(KEYS)} keys x {PER_KEY} messages over {SHARDS} shards: one worker {one:.2f} s, "
        f"three workers {three:.2f} s (x{one / three:.2f}; shards shared out after "
        f"{shared_after:.1f} s; messages per worker {sorted(pids.values())}); "
        f"{out_of_order} out of order, {overlapping} overlapping"
    )
    assert (out_of_order, overlapping) == (0, 0)
    assert len(pids) == 3
    starts = Counter((e["key"], e["seq"]) for e in by_event(events, "start"))
    assert set(starts) == {(key, seq) for key in KEYS for seq in range(2 * PER_KEY)}
    assert set(starts.values()) == {1}  # no worker died: nothing ran twice


async def test_per_key_order_holds_when_a_worker_is_killed(
    connection: AbstractRobustConnection, publisher: Publisher, workers: Workers
) -> None:
    rng = random.Random(11)
    for _ in range(3):
        workers.start()
    await workers_joined(connection, 3)
    await share_out(publisher, workers, 3)
    burst = range(0, PER_KEY)
    publishing = asyncio.create_task(publish_keyed(connection, burst, rng))
    await workers.wait_for("300 handled", lambda events: len(by_event(events, "end")) >= 300)
    busy = Counter(e["pid"] for e in by_event(workers.events(), "end")[-50:])
    victim = next(p for p in workers.processes if p.pid == busy.most_common(1)[0][0])
    victim.kill()
    assert await asyncio.to_thread(exited, victim) == -signal.SIGKILL
    killed_at = time.time()
    await publishing
    await workers.wait_for("every message handled", all_finished(burst), seconds=60)
    await stop(workers)

    events = workers.events()
    out_of_order, overlapping = order_violations(events)
    ended = {(e["pid"], e["key"], e["seq"]) for e in by_event(events, "end")}
    unfinished = [
        (e["key"], e["seq"])
        for e in by_event(events, "start")
        if e["pid"] == victim.pid and (victim.pid, e["key"], e["seq"]) not in ended
    ]
    after = [e for e in by_event(events, "end") if e["at"] > killed_at]
    print(
        f"killed worker {victim.pid} after {300} of {len(KEYS) * PER_KEY}; "
        f"{len(unfinished)} message(s) it had running ran again elsewhere; "
        f"{len(after)} finished after the kill by {sorted({e['pid'] for e in after})}; "
        f"{out_of_order} out of order, {overlapping} overlapping"
    )
    assert (out_of_order, overlapping) == (0, 0)
    assert all_finished(burst)(events)  # nothing lost
    assert victim.pid not in {e["pid"] for e in after}
    assert unfinished  # it died mid-handler: those ran again, in order, on another worker


async def test_a_poison_message_stops_only_its_key_until_it_is_dead_lettered(
    amqp_url: str,
    connection: AbstractRobustConnection,
    publisher: Publisher,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
) -> None:
    """block_and_dlq (the default): three attempts in place, the key waits, then the DLQ."""
    dead: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
    channel = await connection.channel()
    dlq = await channel.get_queue(naming.dead_letter_queue("orders"))
    await dlq.consume(dead.put, no_ack=True)

    keys = [f"k{n}" for n in range(6)]
    for seq in range(8):
        await publisher.publish_many(
            [
                Envelope(
                    queue="orders",
                    payload={"seq": seq, "poison": key == "k0" and seq == 2},
                    priority=7,
                    partition_key=key,
                )
                for key in keys
            ]
        )

    events: list[tuple[str, str, int, int, float]] = []
    all_done = asyncio.Event()
    local = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=TOPOLOGY)

    @local.consumer("orders", concurrency=4)
    async def handle(msg: Message) -> None:
        assert msg.partition_key is not None
        seq = msg.payload["seq"]
        events.append(("start", msg.partition_key, seq, msg.attempt, time.monotonic()))
        await asyncio.sleep(0.02)
        events.append(("end", msg.partition_key, seq, msg.attempt, time.monotonic()))
        if sum(1 for e in events if e[0] == "end") == 3 + 6 * 8 - 1:
            all_done.set()
        if msg.payload["poison"]:
            raise ValueError("poison")

    await start_worker(local)
    letter = await asyncio.wait_for(dead.get(), 30)
    await asyncio.wait_for(all_done.wait(), 30)

    poison = [e for e in events if e[1] == "k0" and e[2] == 2 and e[0] == "start"]
    assert [e[3] for e in poison] == [1, 2, 3]  # attempts, in place
    given_up = max(e[4] for e in events if e[1] == "k0" and e[2] == 2)
    first_try = poison[0][4]
    k0 = [e[2] for e in events if e[1] == "k0" and e[0] == "start"]
    assert k0 == [0, 1, 2, 2, 2, 3, 4, 5, 6, 7]
    behind = [e[4] for e in events if e[1] == "k0" and e[2] > 2 and e[0] == "start"]
    assert min(behind) > given_up  # the key waited for it
    others = [e for e in events if e[1] != "k0" and first_try < e[4] < given_up]
    print(
        f"poison retried in place for {given_up - first_try:.2f} s; meanwhile "
        f"{len(others)} events of other keys"
    )
    assert others  # the other keys (and so the other shards) went on meanwhile
    for key in keys[1:]:
        assert [e[2] for e in events if e[1] == key and e[0] == "start"] == list(range(8))
    assert letter.headers[FAILURE_CAUSE] == "max-attempts"
    assert letter.headers[ATTEMPTS] == 3
    assert letter.headers[PARTITION_KEY] == "k0"


async def test_a_strictly_serial_queue_runs_in_publish_order_across_three_workers(
    connection: AbstractRobustConnection, publisher: Publisher, workers: Workers
) -> None:
    """One message at a time, cluster-wide, in publish order, also when the worker that runs
    them is stopped and another takes over."""
    rng = random.Random(3)
    for _ in range(3):
        workers.start()
    await workers_joined(connection, 3)  # the orders queue's roster: all three are up
    count = 200

    async def publish_commands() -> None:
        for seq in range(count):  # one after the other: publish order is the queue's order
            await publisher.publish(
                Envelope(
                    queue="commands",
                    payload={"seq": seq, "sleep": rng.uniform(0.002, 0.01)},
                    priority=rng.randint(0, 9),  # priorities do not reorder a serial queue
                )
            )

    publishing = asyncio.create_task(publish_commands())
    await workers.wait_for("60 commands", lambda events: len(by_event(events, "end")) >= 60)
    active = by_event(workers.events(), "end")[-1]["pid"]
    stopped = next(p for p in workers.processes if p.pid == active)
    stopped.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(exited, stopped) == 0
    await publishing
    await workers.wait_for(
        "every command", lambda events: len(by_event(events, "end")) >= count, seconds=60
    )
    await stop(workers)

    events = [e for e in workers.events() if e["queue"] == "commands"]
    starts = by_event(events, "start")
    assert [e["seq"] for e in starts] == list(range(count))
    by_time = sorted(events, key=lambda e: e["at"])
    assert [e["event"] for e in by_time] == ["start", "end"] * count  # one at a time
    pids = [e["pid"] for e in starts]
    handover = pids.index(next(pid for pid in pids if pid != active))
    print(
        f"{count} commands in publish order; worker {active} stopped, "
        f"the next one took over at #{handover}"
    )
    assert active not in pids[handover:]

"""Workers SIGKILLed again and again while they drain N messages: every message is handled
at least once, and the duplicates are counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import aio_pika
import pytest

from bandgate.consumers import ConsumerApp, Message
from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.wire import Envelope
from tests.integration.test_consumer_process import RECORD_ENV, ROOT, Workers

pytestmark = [pytest.mark.integration, pytest.mark.fault]

MESSAGES = 600
KILLS = 5

# Crash tolerance high enough that being caught in a kill a few times is not a crash loop.
TOPOLOGY = parse_topology(
    {"delay": {"levels": 4}, "queues": {"orders": {"retry": {"max_deliveries": 20}}}}
)
app = ConsumerApp(topology=TOPOLOGY)


@app.consumer("orders", concurrency=4)
def handle(msg: Message) -> None:
    time.sleep(0.02)
    with open(os.environ[RECORD_ENV], "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": "end", "id": msg.payload["n"], "pid": os.getpid()}) + "\n")


class KillableWorkers(Workers):
    def start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "BANDGATE_AMQP_URL": self.amqp_url, RECORD_ENV: str(self.record_path)}
        process = subprocess.Popen(
            [sys.executable, "-m", "bandgate.consumers", f"{__name__}:app",
             "--log-level", "error"],
            cwd=ROOT,
            env=env,
        )  # fmt: skip
        self.processes.append(process)
        return process


def handled_at_least(count: int) -> Callable[[list[dict[str, object]]], bool]:
    return lambda events: len(events) >= count


@pytest.fixture
def workers(amqp_url: str, tmp_path: Path) -> Iterator[KillableWorkers]:
    running = KillableWorkers(amqp_url, tmp_path / "record.jsonl")
    yield running
    for process in running.processes:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


async def test_repeatedly_killed_workers_handle_everything(
    workers: KillableWorkers, amqp_url: str
) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, TOPOLOGY)
        publisher = Publisher(TOPOLOGY, ChannelSet(confirm_channel_factory(connection)))
        results = await publisher.publish_many(
            [Envelope(queue="orders", payload={"n": n}, priority=n % 10) for n in range(MESSAGES)]
        )
        assert all(isinstance(result, Published) for result in results)
        await publisher.channels.close()

        victims = [workers.start(), workers.start()]
        for kill in range(KILLS):
            await workers.wait_for("progress", handled_at_least((kill + 1) * MESSAGES // 8))
            victim = victims[kill % 2]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(10)
            victims[kill % 2] = workers.start()
        await workers.wait_for(
            "every message", lambda events: len({e["id"] for e in events}) == MESSAGES
        )
        handled = Counter(event["id"] for event in workers.events())
        channel = await connection.channel()
        dlq = await channel.declare_queue(naming.dead_letter_queue("orders"), passive=True)
        dead = dlq.declaration_result.message_count
    duplicates = sum(count - 1 for count in handled.values())
    print(
        f"\nworker kills: {MESSAGES} messages, {KILLS} SIGKILLs, handled {len(handled)} "
        f"distinct ({sum(handled.values())} runs), duplicates {duplicates}, dead-lettered {dead}"
    )
    assert set(handled) == set(range(MESSAGES))
    assert dead == 0

"""Many tenants publishing at steady rates, from a process of its own (`bench tenants`' load).

`python -m bench.tenant_publisher CONFIG OUT` (a `TenantLoad` as JSON) publishes each stream's
messages at its rate, through bandgate's publishing core (`core.publishing.Publisher`, the one
the gateway and the Python producer use), so a fair band's detector (`core.fairness`) decides
per message, as in production. Each payload carries `seq` (the stream's class times `CLASS`,
plus its number), `t` (wall-clock publish time) and `run`, which the worker's `Recorder` turns
into a dwell time. A stream's rate 0 publishes its messages all at once (a backlog); a stream
begins `start` seconds into the run. Every `TICK` the messages due are sent as one pipelined
batch; the process prints `sent` once all are confirmed and writes every message's publish time
to OUT.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import orjson

from bandgate.core.publishing import ChannelSet, Published, Publisher, confirm_channel_factory
from bandgate.topology.loader import load_topology
from bandgate.topology.wire import Envelope
from bench.child import ChildProcess

CLASS = 1_000_000  # seq = class * CLASS + n: a stream's class is seq // CLASS
TICK = 0.005
FILLER = "x" * 200


@dataclass
class Stream:
    klass: int  # 0: hot messages; 1-10: the tenants
    tenant: str | None
    priority: int
    rate: float  # messages per second; 0: all at once
    count: int
    first: int = 0  # the number of its first message
    start: float = 0.0  # seconds into the run before its first message


@dataclass
class TenantLoad:
    amqp_url: str
    topology: str  # the topology file (the worker loads the same)
    queue: str
    streams: list[Stream]
    run: str


def envelope(load: TenantLoad, stream: Stream, n: int) -> Envelope:
    seq = stream.klass * CLASS + stream.first + n
    payload = {"seq": f"{seq:+010d}", "t": f"{time.time():.6f}", "run": load.run, "data": FILLER}
    return Envelope(load.queue, payload, stream.priority, tenant=stream.tenant)


def due(load: TenantLoad, elapsed: float, sent: list[int]) -> list[tuple[Stream, int]]:
    """The messages due after `elapsed` seconds that are not sent yet, interleaved."""
    batch = []
    for index, stream in enumerate(load.streams):
        since = elapsed - stream.start
        if since < 0:
            continue
        upto = stream.count if not stream.rate else min(stream.count, int(since * stream.rate))
        batch += [(stream, n) for n in range(sent[index], upto)]
        sent[index] = max(sent[index], upto)
    batch.sort(key=lambda item: item[0].start + item[1] / (item[0].rate or 1e9))  # in time order
    return batch


async def publish(load: TenantLoad) -> dict[str, float]:
    topology = load_topology(Path(load.topology))
    connection = await aio_pika.connect(load.amqp_url)
    times: dict[str, float] = {}
    async with connection:
        publisher = Publisher(topology, ChannelSet(confirm_channel_factory(connection)))
        sent = [0] * len(load.streams)
        total = sum(stream.count for stream in load.streams)
        pending: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        while sum(sent) < total:
            batch = [envelope(load, s, n) for s, n in due(load, time.monotonic() - start, sent)]
            if batch:
                task = asyncio.create_task(_confirmed(publisher, batch, times))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.sleep(TICK)
        await asyncio.gather(*pending)
        await publisher.channels.close()
    print("sent", flush=True)
    return times


async def _confirmed(publisher: Publisher, batch: list[Envelope], times: dict[str, float]) -> None:
    results = await publisher.publish_many(batch)
    for envelope, result in zip(batch, results, strict=True):
        if not isinstance(result, Published):
            raise RuntimeError(f"not published: {result!r}")
        times[envelope.payload["seq"]] = float(envelope.payload["t"])


def main() -> None:
    raw = json.loads(sys.argv[1])
    raw["streams"] = [Stream(**stream) for stream in raw["streams"]]
    times = asyncio.run(publish(TenantLoad(**raw)))
    Path(sys.argv[2]).write_bytes(orjson.dumps(times))


class TenantPublisher(ChildProcess):
    """Start the publisher; `result()` gives every message's publish time by `seq`."""

    def __init__(self, load: TenantLoad) -> None:
        super().__init__("bench.tenant_publisher", load)

    def result(self, timeout: float) -> dict[int, float]:
        times: dict[str, float] = self.wait(timeout)
        return {int(seq): t for seq, t in times.items()}


if __name__ == "__main__":
    main()

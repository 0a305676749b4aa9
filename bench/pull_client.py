"""The HTTP side of `python -m bench pull`, in a process of its own: receivers and a publisher.

`python -m bench.pull_client CONFIG OUT` (a `PullClientConfig` as JSON) runs, against a gateway:

- `receivers` receive loops, each on its own keep-alive connection: `receive` (`max_messages`,
  `wait_seconds`), then for every message the handler (record it with the worker benchmarks'
  `Recorder`, then sleep `handler_ms`), then one batch ack (`POST receipts/ack`) of them all;
  with `ack_in_receive`, no batch ack: the next receive carries the receipts (its `ack`),
  one request per batch instead of two, and a batch ack settles the last batch at the end;
- and, with `publish` > 0, a publisher on a connection of its own: `warmup_publish` messages,
  then `publish` measured ones, one at a time at random intervals of `interval_ms`, each
  payload carrying `seq`, `run` and `t`, the wall-clock time just before its request is sent.

It prints `ready` once the gateway is, stops after `expect` messages received, or once the
publisher is done (and, with receivers, everything it sent was received), or on SIGTERM, and
writes the `Recorder`'s record to OUT with what a run must check: message ids received twice,
receipts the ack refused, and every response that was not the expected status.

The client is `bench.http_client.RawHttp`: httpx spends more CPU per request than the gateway
does (`bench/publish.py`), and what this process spends is counted in the CPU per message. wrk
is not used: each ack carries the receipts of the receive before it, which wrk's Lua scripts
would have to parse out of JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bandgate.consumers.worker import run_on_event_loop
from bench.http_client import RawHttp
from bench.worker_process import Recorder, WorkerProcess

HOST = "127.0.0.1"
READY_TIMEOUT = 60.0
# A receive refused with these carried out its `ack` first (docs/guides/consume-http.md).
ACKED_BEFORE = {"too_many_leases", "too_many_receives", "broker_unavailable"}
SETTLE = 1.0  # between the receivers' first receive and the first publish
FINISH = 10.0  # for what was published to be received, and for the loops to end


@dataclass
class PullClientConfig:
    port: int
    queue: str = "orders"
    receivers: int = 8
    max_messages: int = 10
    wait_seconds: float = 1.0
    handler_ms: float = 0.0
    ack_in_receive: bool = False
    expect: int = 0  # stop after this many messages received; 0: see the module docstring
    warmup: int = 1  # the drain is timed from this message on
    publish: int = 0
    warmup_publish: int = 5
    interval_ms: tuple[float, float] = (50.0, 200.0)
    seed: int = 0
    run: str = ""
    broker_pid: int | None = None
    gateway_pid: int | None = None


class Client:
    def __init__(self, config: PullClientConfig) -> None:
        self.config = config
        self.recorder = Recorder(config)
        self.stop = asyncio.Event()
        self.recorder.on_done = self.stop.set
        self.ids: set[str] = set()
        self.repeated = 0  # message ids received more than once
        self.acked = 0
        self.ack_failed: list[Any] = []
        self.unexpected: Counter[str] = Counter()  # "<request> <status>"
        self.sent: dict[int, float] = {}
        self.publish_ms: list[float] = []
        self.request_ms: dict[str, list[float]] = {"receive": [], "ack": []}
        self.http = RawHttp(HOST, config.port, config.receivers + 1)

    async def ready(self) -> None:
        await self.http.open()
        deadline = time.monotonic() + READY_TIMEOUT
        while (await self.http.request("GET", "/readyz"))[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway was not ready in {READY_TIMEOUT:g} s")
            await asyncio.sleep(0.1)

    async def receive_loop(self) -> None:
        path = f"/v1/queues/{self.config.queue}"
        asked = {"max_messages": self.config.max_messages, "wait_seconds": self.config.wait_seconds}
        plain = orjson.dumps(asked)
        receipts: list[str] = []
        while not self.stop.is_set():
            carried = self.config.ack_in_receive and receipts
            body = orjson.dumps({**asked, "ack": receipts}) if carried else plain
            started = time.perf_counter()
            status, answer = await self.http.request("POST", f"{path}/receive", body)
            self.request_ms["receive"].append((time.perf_counter() - started) * 1000)
            if status != 200:
                self.unexpected[f"receive {status}"] += 1
                if carried and orjson.loads(answer)["error"]["code"] in ACKED_BEFORE:
                    receipts = []  # settled before the receive was refused
                await asyncio.sleep(0.1)
                continue
            received = orjson.loads(answer)
            if carried:
                self.settled(received["ack"])
            receipts = await self.handle(received["messages"])
            if receipts and not self.config.ack_in_receive:
                await self.ack(f"{path}/receipts/ack", receipts)
        if receipts and self.config.ack_in_receive:
            await self.ack(f"{path}/receipts/ack", receipts)

    async def handle(self, messages: list[dict[str, Any]]) -> list[str]:
        """Record each message, after the handler's pause; their receipts."""
        pause = self.config.handler_ms / 1000
        receipts = []
        for message in messages:
            if message["message_id"] in self.ids:
                self.repeated += 1
            self.ids.add(message["message_id"])
            self.recorder.record(message["payload"])
            if pause:
                await asyncio.sleep(pause)
            receipts.append(message["receipt"])
        return receipts

    async def ack(self, path: str, receipts: list[str]) -> None:
        started = time.perf_counter()
        status, body = await self.http.request("POST", path, orjson.dumps({"receipts": receipts}))
        self.request_ms["ack"].append((time.perf_counter() - started) * 1000)
        if status != 200:
            self.unexpected[f"ack {status}"] += 1
            return
        self.settled(orjson.loads(body))

    def settled(self, answer: dict[str, Any]) -> None:
        """Count a batch ack's answer (or a receive's `ack`)."""
        self.acked += len(answer["successful"])
        self.ack_failed += answer["failed"]

    async def publish(self, seq: int, run: str) -> None:
        t = time.time()
        payload = {"seq": seq, "t": f"{t:.6f}", "run": run}
        path = f"/v1/queues/{self.config.queue}/messages"
        status, _ = await self.http.request("POST", path, orjson.dumps({"payload": payload}))
        if status != 201:
            self.unexpected[f"publish {status}"] += 1
        elif run == self.config.run:
            self.sent[seq] = t
            self.publish_ms.append((time.time() - t) * 1000)

    async def publisher(self) -> None:
        """Warm-up messages (other runs' to the recorder), then the measured ones."""
        config = self.config
        pick = random.Random(config.seed)
        for n in range(-config.warmup_publish, config.publish):
            await asyncio.sleep(pick.uniform(*config.interval_ms) / 1000)
            await self.publish(n, config.run if n >= 0 else f"{config.run}-warmup")

    def result(self) -> dict[str, Any]:
        return {
            **self.recorder.result(),
            "received_ids": len(self.ids),
            "repeated_ids": self.repeated,
            "acked": self.acked,
            "ack_failed": self.ack_failed,
            "unexpected": dict(self.unexpected),
            "sent": {str(seq): t for seq, t in self.sent.items()},
            "publish_ms": self.publish_ms,
            **{
                f"{kind}_p50_ms": statistics.median(times) if times else None
                for kind, times in self.request_ms.items()
            },
            "receives": len(self.request_ms["receive"]),
        }


async def serve(client: Client) -> None:
    config = client.config
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, client.stop.set)
    await client.ready()
    loops = [asyncio.create_task(client.receive_loop()) for _ in range(config.receivers)]
    print("ready", flush=True)
    if config.publish:
        await asyncio.sleep(SETTLE if loops else 0)
        await client.publisher()
        if loops:
            waiting = asyncio.create_task(client.stop.wait())
            await asyncio.wait([waiting, *loops], timeout=FINISH)
            waiting.cancel()
        client.stop.set()
        await _end_long_polls(client, loops)
    await client.stop.wait()
    if loops:
        done, pending = await asyncio.wait(loops, timeout=config.wait_seconds + FINISH)
        for task in pending:
            task.cancel()
        for task in done:
            task.result()  # a loop that failed fails the run
    await client.http.close()


async def _end_long_polls(client: Client, loops: list[asyncio.Task[None]]) -> None:
    """Give each loop still in a long poll a message to end it with: a client that hung up
    would leave its `receive` waiting in the gateway, to lease the next run's message."""
    deadline = time.monotonic() + FINISH
    while not all(loop.done() for loop in loops) and time.monotonic() < deadline:
        await client.publish(0, f"{client.config.run}-sentinel")
        await asyncio.wait(loops, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)


def main() -> None:
    raw = json.loads(sys.argv[1])
    raw["interval_ms"] = tuple(raw["interval_ms"])
    client = Client(PullClientConfig(**raw))
    run_on_event_loop(serve(client))  # uvloop, as the gateway and the worker run
    Path(sys.argv[2]).write_bytes(orjson.dumps(client.result()))


class PullClient(WorkerProcess):
    """Start the client and wait until the gateway is ready; `wait()` or `stop()` for its
    record."""

    MODULE = "bench.pull_client"


if __name__ == "__main__":
    main()

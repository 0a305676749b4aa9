"""Hot messages at a steady rate, from a process of its own (the priority benchmark's load).

`python -m bench.paced_publisher CONFIG OUT` (a `PacedConfig` as JSON) publishes `rate` messages
per second, confirmed and persistent, in bandgate's wire format, with a 1 KiB JSON payload
carrying `seq` (negative during the warm-up), `t` (wall-clock publish time) and `run`; the
worker's handler turns `t` into a wait. It prints `measuring` when the measured part starts
and `sent` once its last message is written, then waits for the confirms and writes the
measured messages' publish times to OUT. It publishes with `bench.raw_amqp` (frames made
once, ~tens of microseconds per message), so that it leaves the two cores to the worker and
the broker. `PacedPublisher` is the parent's handle.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from bandgate.topology import wire
from bench.child import ChildProcess
from bench.raw_amqp import RawPublisher, message_ids

FILLER = "x" * 940  # with the other fields, about 1 KiB on the wire


@dataclass
class PacedConfig:
    amqp_url: str
    exchange: str
    routing_key: str
    priority: int
    rate: float
    warmup_seconds: float
    seconds: float
    run: str


def body(seq: int, t: float, run: str) -> bytes:
    """The payload, always of the same length (numbers written with fixed widths)."""
    return orjson.dumps({"seq": f"{seq:+010d}", "t": f"{t:.6f}", "run": run, "data": FILLER})


def publish(config: PacedConfig) -> dict[int, float]:
    envelope = wire.Envelope(queue="orders", payload=None, priority=config.priority)
    message = wire.encode(envelope, body(0, time.time(), config.run))
    template = RawPublisher.template(config.exchange, config.routing_key, message)
    warmup = round(config.warmup_seconds * config.rate)
    total = warmup + round(config.seconds * config.rate)
    ids = message_ids(total)
    sent: dict[int, float] = {}
    publisher = RawPublisher(config.amqp_url)
    try:
        start = time.monotonic()
        for n in range(total):
            due = start + n / config.rate
            while (now := time.monotonic()) < due:
                publisher.poll(due - now)
            seq = n - warmup
            if seq == 0:
                print("measuring", flush=True)
            t = time.time()
            publisher.send(template.frames(ids[n], body(seq, t, config.run)))
            if seq >= 0:
                sent[seq] = t
        print("sent", flush=True)
        publisher.wait_confirmed()
    finally:
        publisher.close()
    return sent


def main() -> None:
    config = PacedConfig(**json.loads(sys.argv[1]))
    sent = publish(config)
    Path(sys.argv[2]).write_bytes(orjson.dumps({str(seq): t for seq, t in sent.items()}))


class PacedPublisher(ChildProcess):
    """Start the publisher; `measuring()`, `sent()`, then `result()` for the publish times."""

    def __init__(self, config: PacedConfig) -> None:
        super().__init__("bench.paced_publisher", config)
        self.seconds = config.seconds

    def measuring(self, timeout: float = 60.0) -> None:
        self.expect_line("measuring", timeout)

    def sent(self) -> None:
        self.expect_line("sent", self.seconds * 3 + 30)

    def result(self, timeout: float = 60.0) -> dict[int, float]:
        """Publish time of each measured message, by `seq`, once the process is done."""
        sent: dict[str, float] = self.wait(timeout)
        return {int(seq): t for seq, t in sent.items()}


if __name__ == "__main__":
    main()

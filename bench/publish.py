"""Publish throughput and latency: raw aio-pika confirmed publishing vs the gateway.

Raw: one confirm channel, `WINDOW` publishes in flight. Gateway: a gateway process (uvicorn,
one worker) saturated by wrk (a separate process; `apt-get install wrk`) with `WINDOW`
connections, one message per request, then 100 per batch request; and one message per request
to a gateway of two processes (`BANDGATE_WORKERS=2`), whether a second process pays on a
machine of two cores shared with the broker and wrk (issue 35); and the floor under the
gateway (`bench.publish_floor`): plain uvicorn with the publishing core alone, and uvicorn
with no publish, the same wrk load and CPU accounting, no latency run; and the same two floors
under granian (its ASGI interface, one worker, uvloop) when it is installed (the `bench` extra):
whether a server written in Rust would lower the floor that uvicorn sets. Latency is measured with
an async HTTP client at half of each one's own maximum rate (python-side HTTP clients cannot
saturate the gateway: httpx tops out far below it); and the gateway's publishing core alone,
in this process with no HTTP, paced at the gateway's half rate: latency only.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import httpx
import orjson

from bandgate.core.broker import BrokerLink
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology, broker_version
from bandgate.topology.loader import load_topology
from bandgate.topology.model import Topology
from bandgate.topology.publish_input import envelope_for
from bench.environment import BenchBroker, cpu_seconds, wait_for_quiet
from bench.http_client import RawHttp
from bench.rounds import ROUNDS, median_run, paired_ratios, with_median
from bench.stage import floor_process, gateway_process

WINDOW = 64
BATCH = 100
PAYLOAD = {"data": "x" * 1000}  # about 1 KiB on the wire

Sender = Callable[[], Awaitable[None]]


async def _saturate(send: Sender, count: int, window: int) -> float:
    """Messages per second with `window` sends in flight."""
    remaining = count

    async def lane() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await send()

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(window)))
    return count / (time.perf_counter() - started)


async def _paced(send: Sender, rate: float, seconds: float) -> list[float]:
    """Latencies (ms) of sends issued at a fixed `rate` for `seconds`."""
    latencies: list[float] = []
    interval = 1.0 / rate
    tasks = []

    async def one() -> None:
        started = time.perf_counter()
        await send()
        latencies.append((time.perf_counter() - started) * 1000)

    start = time.perf_counter()
    n = 0
    while (now := time.perf_counter()) - start < seconds:
        due = start + n * interval
        if due > now:
            await asyncio.sleep(due - now)
        tasks.append(asyncio.create_task(one()))
        n += 1
    await asyncio.gather(*tasks)
    return latencies


WRK_SECONDS = 5


def _wrk(url: str, body: bytes, connections: int, seconds: int = WRK_SECONDS) -> float:
    """Requests per second wrk reaches posting `body` to `url`."""
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk (make bench does)")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {_lua_string(body)}\n"
            "done = function(summary, latency, requests)\n"
            '  io.write(string.format("non2xx %d\\n", summary.errors.status))\n'
            "end\n"
        )
    result = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", script.name, url],
        capture_output=True,
        text=True,
        check=True,
    )
    os.unlink(script.name)
    errors = re.search(r"non2xx (\d+)", result.stdout)
    if errors and int(errors.group(1)):
        raise RuntimeError(f"wrk saw {errors.group(1)} failed requests:\n{result.stdout}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", result.stdout)
    if match is None:
        raise RuntimeError(f"unexpected wrk output:\n{result.stdout}")
    return float(match.group(1))


def _lua_string(data: bytes) -> str:
    return "'" + data.decode().replace("\\", "\\\\").replace("'", "\\'") + "'"


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    q = statistics.quantiles(ordered, n=100)
    return {"p50_ms": q[49], "p99_ms": q[98]}


async def _purge(url: str, topology_queues: list[str]) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in topology_queues:
            queue = await channel.get_queue(name)
            await queue.purge()


def run_publish(broker: BenchBroker, messages: int) -> list[dict[str, Any]]:
    """Raw, single and batch `ROUNDS` times, interleaved; each row is its median-rate run
    (`rate_runs`: every run's), the ratio is the median of the rounds' ratios
    (`ratio_runs`), and p50/p99 are the medians of the runs' (`p99_ms_runs`: every run's)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(gateway_process(broker))
        two = stack.enter_context(gateway_process(broker, workers=2))
        floors = {
            name: stack.enter_context(_publish_floor(broker, publish, server))
            for name, (server, publish) in FLOORS.items()
            if server == "uvicorn" or GRANIAN
        }
        # Every contender started and connected before the first round: their start-up
        # (imports, connecting) took CPU from the first raw run and lifted round 0's ratios.
        for port, _ in (one, two, *floors.values()):
            asyncio.run(_wait_ready(port))
        wait_for_quiet()
        for _ in range(ROUNDS):
            rows = asyncio.run(_raw(broker, messages))
            rows += asyncio.run(_through_gateway(broker, *one))
            rows += asyncio.run(_through_gateway(broker, *two, processes=2))
            rows += [asyncio.run(_floor(broker, *at, name)) for name, at in floors.items()]
            for row in rows:
                runs.setdefault(row["name"], []).append(row)
    medians = [_median_row(done) for done in runs.values()]
    ratios = paired_ratios(runs, medians[0]["name"])
    return [
        {
            "name": m["name"],
            "rate": m["rate"],
            "ratio": ratios[m["name"]][0],
            **m,
            "ratio_runs": ratios[m["name"]][1],
        }
        for m in medians
    ]


def _median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median-rate run, with latency as its own median over the runs (a broker stall
    decides one run's p99); the floor rows have no latency."""
    row = median_run(runs, "rate")
    for key in ("p50_ms", "p99_ms"):
        if key in row:
            row = with_median(row, runs, key)
    return row


FLOOR = "floor: uvicorn + publishing core, 1 message/request"
SERVER_ONLY = "floor: uvicorn, no publish"
# name: (server, publish)
FLOORS = {
    FLOOR: ("uvicorn", True),
    SERVER_ONLY: ("uvicorn", False),
    "floor: granian (ASGI) + publishing core, 1 message/request": ("granian", True),
    "floor: granian (ASGI), no publish": ("granian", False),
}
GRANIAN = importlib.util.find_spec("granian") is not None


def _publish_floor(
    broker: BenchBroker, publish: bool, server: str
) -> contextlib.AbstractContextManager[tuple[int, int]]:
    """`bench.publish_floor` under `server`, publishing or not: port and pid."""
    settings = {"BANDGATE_BENCH_FLOOR_PUBLISH": "true" if publish else "false"}
    return floor_process(broker, "bench.publish_floor:app", server, settings)


async def _floor(broker: BenchBroker, port: int, pid: int, name: str) -> dict[str, Any]:
    """The floor's rate and CPU per request under the single-message wrk load."""
    url = f"http://127.0.0.1:{port}/v1/queues/orders/messages"
    await asyncio.to_thread(_wrk, url, SINGLE_BODY, WINDOW, 1)  # warm-up
    cpu0 = cpu_seconds(pid)
    rate = await asyncio.to_thread(_wrk, url, SINGLE_BODY, WINDOW)
    cpu = cpu_seconds(pid) - cpu0
    await _purge(broker.amqp_url, _order_bands())
    return {
        "name": name,
        "rate": rate,
        "gateway_cpu_s": cpu,
        "gateway_us_per_msg": cpu / (rate * WRK_SECONDS) * 1e6,
    }


async def _raw(broker: BenchBroker, messages: int) -> list[dict[str, Any]]:
    topology = load_topology()
    queues = _order_bands(topology)
    connection = await aio_pika.connect(broker.amqp_url)
    await apply_topology(connection, topology)
    broker.version = broker_version(connection)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(topology.exchange)
    body = orjson.dumps(PAYLOAD)

    async def raw_send() -> None:
        message = aio_pika.Message(
            body,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            priority=8,
            content_type="application/json",
        )
        await exchange.publish(message, naming.routing_key("orders", 8), mandatory=True)

    rows: list[dict[str, Any]] = []
    await _saturate(raw_send, 500, WINDOW)  # warm-up
    cpu0 = cpu_seconds(broker.pid)
    raw_rate = await _saturate(raw_send, messages, WINDOW)
    raw_cpu = cpu_seconds(broker.pid) - cpu0
    raw_lat = _percentiles(await _paced(raw_send, raw_rate / 2, 3.0))
    rows.append(
        {
            "name": "raw aio-pika confirmed publish",
            "rate": raw_rate,
            "broker_cpu_s": raw_cpu,
            **raw_lat,
        }
    )
    await _purge(broker.amqp_url, queues)
    await connection.close()

    return rows


async def _through_gateway(
    broker: BenchBroker, port: int, gateway_pid: int, processes: int = 1
) -> list[dict[str, Any]]:
    """The single-message row, and with one process the batch row too."""
    queues = _order_bands()
    raw_http = RawHttp("127.0.0.1", port, WINDOW)
    await raw_http.open()
    try:
        rows = [await _single(broker, port, gateway_pid, raw_http, processes)]
        await _purge(broker.amqp_url, queues)
        if processes == 1:
            rows.append(await _core_paced(broker, rows[0]["rate"] / 2))
            await _purge(broker.amqp_url, queues)
            rows.append(await _batch(port, gateway_pid, raw_http))
            await _purge(broker.amqp_url, queues)
    finally:
        await raw_http.close()
    return rows


def _order_bands(topology: Topology | None = None) -> list[str]:
    """The band queues of `orders`, which every contender publishes to and each run purges."""
    spec = (topology or load_topology()).queue("orders")
    return [naming.band_queue("orders", band.name) for band in spec.bands]


async def _wait_ready(port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        for _ in range(100):
            try:
                if (await http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)


SINGLE_BODY = orjson.dumps({"payload": PAYLOAD, "priority": 8})
BATCH_BODY = orjson.dumps({"messages": [{"payload": PAYLOAD, "priority": 8}] * BATCH})


async def _single(
    broker: BenchBroker, port: int, gateway_pid: int, raw_http: RawHttp, processes: int
) -> dict[str, Any]:
    async def http_send() -> None:
        status = await raw_http.post("/v1/queues/orders/messages", SINGLE_BODY)
        if status != 201:
            raise RuntimeError(f"publish answered {status}")

    await _saturate(http_send, 300, WINDOW)
    g0, b0 = cpu_seconds(gateway_pid), cpu_seconds(broker.pid)
    single_url = f"http://127.0.0.1:{port}/v1/queues/orders/messages"
    single_rate = await asyncio.to_thread(_wrk, single_url, SINGLE_BODY, WINDOW)
    gw_cpu, br_cpu = cpu_seconds(gateway_pid) - g0, cpu_seconds(broker.pid) - b0
    single_lat = _percentiles(await _paced(http_send, single_rate / 2, 3.0))
    name = "gateway HTTP, 1 message/request"
    return {
        "name": name if processes == 1 else f"{name}, {processes} processes",
        "rate": single_rate,
        "gateway_cpu_s": gw_cpu,
        "broker_cpu_s": br_cpu,
        "gateway_us_per_msg": gw_cpu / (single_rate * WRK_SECONDS) * 1e6,
        **single_lat,
    }


CORE_PACED = "publishing core alone, no HTTP, at the gateway's half rate (latency only)"


async def _core_paced(broker: BenchBroker, rate: float) -> dict[str, Any]:
    """The gateway's publishing core (`BrokerLink`, the same confirm channel and input rules)
    in this process, paced as the gateway's latency run was: what the gateway's p50 and p99
    owe to HTTP and the event loop it shares with it, and what to the broker."""
    topology = load_topology()
    spec = topology.queue("orders")
    link = BrokerLink(broker.amqp_url, topology, declare_topology=False)
    await link.start(wait=30)

    async def core_send() -> None:
        await link.publisher.publish(envelope_for(topology, spec, PAYLOAD, priority=8))

    try:
        await _saturate(core_send, 300, WINDOW)  # warm-up
        latency = _percentiles(await _paced(core_send, rate, 3.0))
    finally:
        await link.close()
    return {"name": CORE_PACED, "rate": rate, **latency}


async def _batch(port: int, gateway_pid: int, raw_http: RawHttp) -> dict[str, Any]:
    async def batch_send() -> None:
        status = await raw_http.post("/v1/queues/orders/messages/batch", BATCH_BODY)
        if status != 200:
            raise RuntimeError(f"batch answered {status}")

    batch_url = f"http://127.0.0.1:{port}/v1/queues/orders/messages/batch"
    g0 = cpu_seconds(gateway_pid)
    batch_rate = await asyncio.to_thread(_wrk, batch_url, BATCH_BODY, 4) * BATCH
    batch_cpu = cpu_seconds(gateway_pid) - g0
    batch_lat = _percentiles(await _paced(batch_send, batch_rate / BATCH / 2, 3.0))
    return {
        "name": f"gateway HTTP, batch of {BATCH}",
        "rate": batch_rate,
        "gateway_cpu_s": batch_cpu,
        "gateway_us_per_msg": batch_cpu / (batch_rate * WRK_SECONDS) * 1e6,
        **batch_lat,
    }

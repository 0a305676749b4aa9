"""What several benchmarks set up the same way: the `orders` bands, emptied; a gateway process;
a floor under it; queue depths and deletions."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import aio_pika

from bandgate.ops.local_broker import free_port
from bandgate.topology import naming
from bandgate.topology.declare import apply_topology, broker_version
from bandgate.topology.loader import load_topology
from bench.environment import BenchBroker

QUEUE = "orders"


async def reset_bands(broker: BenchBroker) -> list[str]:
    """Apply the topology, note the broker's version, empty the bands; their queue names,
    hottest first."""
    topology = load_topology()
    connection = await aio_pika.connect(broker.amqp_url)
    async with connection:
        await apply_topology(connection, topology)
        broker.version = broker_version(connection)
        channel = await connection.channel()
        names = [naming.band_queue(QUEUE, band.name) for band in topology.queue(QUEUE).bands]
        for name in names:
            await (await channel.get_queue(name)).purge()
    return names


async def depths(url: str, names: tuple[str, ...], purge: tuple[str, ...] = ()) -> list[int]:
    """Empty the queues `purge` names; the number of messages ready in each of `names`."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in purge:
            await (await channel.get_queue(name)).purge()
        counts = []
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            counts.append(queue.declaration_result.message_count or 0)
    return counts


async def delete(url: str, queues: tuple[str, ...], exchanges: tuple[str, ...] = ()) -> None:
    """Delete queues and exchanges, whether they exist or not."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for name in queues:
            await channel.queue_delete(name)
        for name in exchanges:
            await channel.exchange_delete(name)


@contextmanager
def gateway_process(
    broker: BenchBroker, workers: int = 1, settings: Mapping[str, str] | None = None
) -> Iterator[tuple[int, int]]:
    """A gateway as deployed (`bandgate gateway`: uvicorn with the gateway's HTTP limits, one
    process, or `workers` behind uvicorn's supervisor), with no access log and auth off, on a
    free port, with `settings` (`BANDGATE_*` variables) beside: port and pid (the
    supervisor's, whose CPU counts its workers')."""
    port = free_port()
    env = {
        **os.environ,
        **(settings or {}),
        "BANDGATE_AMQP_URL": broker.amqp_url,
        "BANDGATE_DECLARE_TOPOLOGY": "false",
        "BANDGATE_AUTH_ENABLED": "false",
        "BANDGATE_ACCESS_LOG": "false",
        "BANDGATE_PORT": str(port),
        "BANDGATE_WORKERS": str(workers),
    }
    command = [sys.executable, "-c", "from bandgate.ops.cli import main; main()", "gateway"]
    with server_process(command, env) as pid:
        yield port, pid


@contextmanager
def floor_process(
    broker: BenchBroker,
    app: str,
    server: str = "uvicorn",
    settings: Mapping[str, str] | None = None,
) -> Iterator[tuple[int, int]]:
    """A floor under the gateway (`app`, e.g. `bench.publish_floor:app`) on a free port under
    plain uvicorn (httptools and uvloop, as it picks them) or granian (one worker, uvloop),
    with `settings` beside: port and pid (granian's supervisor, whose CPU counts its
    worker's)."""
    port = free_port()
    env = {**os.environ, **(settings or {}), "BANDGATE_AMQP_URL": broker.amqp_url}
    command = [sys.executable, "-m", server, app, "--port", str(port)]
    if server == "granian":
        command += ["--interface", "asgi", "--workers", "1", "--loop", "uvloop", "--no-ws"]
    command += ["--no-access-log", "--log-level", "warning"]
    with server_process(command, env) as pid:
        yield port, pid


@contextmanager
def server_process(command: list[str], env: Mapping[str, str]) -> Iterator[int]:
    """`command` running with `env` until the block ends (then terminated): its pid."""
    process = subprocess.Popen(command, env=env)
    try:
        yield process.pid
    finally:
        process.terminate()
        process.wait(10)

"""`bandgate receive | ack | release | extend` run as a script runs them, as processes, against
a gateway served on a port and a real broker; each test checks what the gateway and broker hold
afterwards, not only what the command printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from asyncio.subprocess import PIPE, Process
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway

# The HTTP edge (or a CLI over it): the broker matrix leaves it to `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

BANDGATE = str(Path(sys.executable).parent / "bandgate")
# `make test` run in the background of a script (`make test > log &`) starts with SIGINT ignored
# and passes that on to every process it starts. Python keeps an inherited ignored SIGINT ignored
# (a shell's background job must not die of the terminal's Ctrl-C), so the CLI would never see
# the Ctrl-C a test sends. The CLI starts through this: with SIGINT's default, as from a terminal.
WITH_DEFAULT_SIGINT = (
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])",
)
# What a CLI process gets to answer or exit. It starts in about two seconds on an idle machine
# (its imports) and several times that while the suite loads both cores: this bound only turns
# a hang into a failure, it never paces a test.
CLI_SECONDS = 90.0
CONSUMER = "cli-consumer-secret"
PUBLISHER = "cli-publisher-secret"


@pytest.fixture
def topology() -> Topology:
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {
                    "retry": {"max_attempts": 3, "backoff_initial_seconds": 0.2, "jitter": 0}
                }
            },
        }
    )


def _settings(broker: TestBroker, amqp_url: str, **more: Any) -> GatewaySettings:
    return GatewaySettings(
        amqp_url=amqp_url,
        management_url=broker.management_url,
        host="127.0.0.1",
        port=free_port(),
        access_log=False,
        **more,
    )


@pytest.fixture
def live(broker: TestBroker, amqp_url: str, topology: Topology) -> Iterator[LiveGateway]:
    with LiveGateway(_settings(broker, amqp_url, auth_enabled=False), topology) as gateway:
        yield gateway


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines()]


def _env(gateway: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "BANDGATE_TOKEN"}
    return env | {"BANDGATE_GATEWAY_URL": gateway}


@contextlib.asynccontextmanager
async def started(
    live: LiveGateway, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[Process]:
    """`bandgate *args` running, with pipes for its output. On the way out it is killed unless
    it exited, and reaped with its pipes closed: a test that fails half-way leaves no process or
    open transport behind, whose ResourceWarnings would fail the next test in this process."""
    process = await asyncio.create_subprocess_exec(
        *WITH_DEFAULT_SIGINT, BANDGATE, *args, stdout=PIPE, stderr=PIPE, env=env or _env(live.url)
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                process.kill()
        await process.communicate()  # drains its pipes to their end, then reaps it


async def bandgate(live: LiveGateway, *args: str, env: dict[str, str] | None = None) -> Run:
    async with started(live, *args, env=env) as process:
        out, err = await asyncio.wait_for(process.communicate(), CLI_SECONDS)
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


async def next_line(process: Process) -> bytes:
    """The process's next line on stdout; fails with its stderr if it exited instead."""
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), CLI_SECONDS)
    if not line:
        _, err = await asyncio.wait_for(process.communicate(), CLI_SECONDS)
        raise AssertionError(f"exited {process.returncode}: {err.decode()}")
    return line


async def publish(live: LiveGateway, priority: int, payload: Any) -> str:
    async with httpx.AsyncClient(base_url=live.url) as http:
        response = await http.post(
            "/v1/queues/orders/messages", json={"payload": payload, "priority": priority}
        )
    assert response.status_code == 201, response.text
    return str(response.json()["message_id"])


async def ready(amqp: AbstractRobustConnection, topology: Topology) -> int:
    depths = await queue_depths(amqp, topology)
    return sum(depths[f"orders.{band}"] for band in ("hot", "warm", "cold"))


def _seconds_until(moment: str) -> float:
    return datetime.fromisoformat(moment).timestamp() - time.time()


async def test_receive_with_ack_takes_messages_hottest_first(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    sent = [await publish(live, priority, {"n": n}) for n, priority in enumerate((1, 5, 8, 1, 8))]
    # Three receive calls (2, 2, 1 messages); --gateway wins over BANDGATE_GATEWAY_URL.
    env = _env("http://127.0.0.1:1")
    taken = await bandgate(
        live, "receive", "orders", "--gateway", live.url, "--max", "2", "--count", "5",
        "--wait", "2", "--visibility", "1", "--ack", env=env,
    )  # fmt: skip
    assert (taken.code, taken.stderr) == (0, "")
    messages = taken.messages()
    assert [m["band"] for m in messages] == ["hot", "hot", "warm", "cold", "cold"]
    assert sorted(m["message_id"] for m in messages) == sorted(sent)
    for message in messages:
        assert message["receipt"]
        assert (message["attempt"], message["receive_count"]) == (1, 1)
        assert set(message) >= {"payload", "priority", "enqueued_at", "visible_until", "headers"}
    # Taken for good: nothing ready, and nothing comes back after their 1 s leases.
    assert await ready(amqp, topology) == 0
    empty = await bandgate(live, "receive", "orders", "--wait", "2")
    assert (empty.code, empty.stdout, empty.stderr) == (0, "", "")


async def test_an_unacked_message_comes_back_and_ack_takes_it(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    sent = {await publish(live, 8, {"n": n}) for n in range(2)}
    first = await bandgate(live, "receive", "orders", "--max", "10", "--visibility", "1")
    assert first.code == 0, first.stderr
    assert {m["message_id"] for m in first.messages()} == sent
    # Not acked: visible again once the lease lapses, counted as a second receive.
    # Leased long enough for the next CLI process to start (about a second on a slow machine).
    again = await bandgate(
        live, "receive", "orders", "--max", "10", "--count", "2", "--visibility", "10"
    )
    assert again.code == 0, again.stderr
    messages = again.messages()
    assert {m["message_id"] for m in messages} == sent
    assert [m["receive_count"] for m in messages] == [2, 2]

    acked = await bandgate(live, "ack", "orders", *(m["receipt"] for m in messages))
    assert (acked.code, acked.stdout, acked.stderr) == (0, "", "")
    assert await ready(amqp, topology) == 0
    # Gone, not merely leased: their 1 s leases lapse and nothing comes back.
    empty = await bandgate(live, "receive", "orders", "--wait", "2")
    assert (empty.code, empty.stdout) == (0, "")
    twice = await bandgate(live, "ack", "orders", messages[0]["receipt"], "not-a-receipt")
    assert (twice.code, twice.stdout) == (2, "")
    errors = twice.stderr.splitlines()
    assert len(errors) == 2
    assert "lease_expired" in errors[0]
    assert "invalid_receipt" in errors[1]


async def test_release_retries_then_dead_letters(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    sent = await publish(live, 5, {"sku": "x-1"})
    [first] = (await bandgate(live, "receive", "orders")).messages()
    released = await bandgate(
        live, "release", "orders", first["receipt"], "--delay", "0.1", "--reason", "busy"
    )
    assert released.code == 0, released.stderr
    [outcome] = released.messages()
    assert (outcome["outcome"], outcome["attempt"]) == ("retry", 2)

    [second] = (await bandgate(live, "receive", "orders")).messages()
    assert (second["message_id"], second["attempt"]) == (sent, 2)
    dead = await bandgate(
        live, "release", "orders", second["receipt"], "--dead-letter", "--reason", "bad sku"
    )
    assert dead.code == 0, dead.stderr
    [outcome] = dead.messages()
    assert (outcome["outcome"], outcome["cause"]) == ("dead-lettered", "rejected")

    async with httpx.AsyncClient(base_url=live.url) as http:
        letters = (await http.get("/v1/queues/orders/dlq")).json()
    assert letters["count"] == 1
    [letter] = letters["messages"]
    assert letter["message_id"] == sent
    assert "bad sku" in letter["reason"]
    assert await ready(amqp, topology) == 0
    # A settled receipt is refused, with the API's code.
    late = await bandgate(live, "release", "orders", second["receipt"])
    assert (late.code, late.stdout) == (2, "")
    assert "lease_expired" in late.stderr


async def test_extend_keeps_a_message_leased(live: LiveGateway) -> None:
    await publish(live, 8, {})
    # The first lease outlasts the next CLI process's start (about a second on a slow machine).
    [message] = (await bandgate(live, "receive", "orders", "--visibility", "3")).messages()
    extended = await bandgate(live, "extend", "orders", message["receipt"], "--visibility", "12")
    assert extended.code == 0, extended.stderr
    [answer] = extended.messages()
    assert 10.5 < _seconds_until(answer["visible_until"]) <= 12
    # Past the first lease's end: still invisible.
    hidden = await bandgate(live, "receive", "orders", "--wait", "4")
    assert (hidden.code, hidden.stdout) == (0, "")
    acked = await bandgate(live, "ack", "orders", message["receipt"])
    assert acked.code == 0, acked.stderr


async def test_forever_prints_each_message_as_it_comes(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    receiving = ("receive", "orders", "--forever", "--ack", "--wait", "1")
    async with started(live, *receiving) as process:
        for n in range(3):  # one at a time: each line must arrive before the next publish
            sent = await publish(live, 2, {"n": n})
            assert json.loads(await next_line(process))["message_id"] == sent
        # Ctrl-C, once it printed (so it is in its loop, not still importing): it stops
        # whatever it waits on, a long poll or an ack.
        process.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(process.communicate(), CLI_SECONDS)
    assert process.returncode == 130, err.decode()
    assert await ready(amqp, topology) == 0


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (("receive", "nosuch", "--wait", "0"), 2, "unknown_queue"),
        (("receive", "orders", "--max", "11"), 2, "--max"),
        (("receive", "orders", "--wait", "21"), 2, "--wait"),
        (("receive", "orders", "--visibility", "0"), 2, "--visibility"),
        (("receive", "orders", "--count", "2", "--forever"), 2, "--count"),
        (("ack", "orders", "abc.1.xyz"), 2, "invalid_receipt"),
        (("extend", "orders", "x", "--visibility", "5"), 2, "invalid_receipt"),
        (("release", "orders", "x", "--delay", "1", "--dead-letter"), 2, "conflicting_fields"),
        (("receive", "orders", "--wait", "0", "--gateway", "http://127.0.0.1:1"), 1, "unreachable"),
    ],
)
async def test_bad_input_exits_with_the_error_on_stderr(
    live: LiveGateway, args: tuple[str, ...], code: int, expected: str
) -> None:
    result = await bandgate(live, *args)
    assert (result.code, result.stdout) == (code, "")
    assert expected in result.stderr


async def test_the_token_is_sent_as_bearer(
    broker: TestBroker, amqp_url: str, topology: Topology
) -> None:
    tokens = (
        TokenSpec(name="script", sha256=hash_token(CONSUMER), scopes=("consume:orders",)),
        TokenSpec(name="app", sha256=hash_token(PUBLISHER), scopes=("publish:orders",)),
    )
    with LiveGateway(_settings(broker, amqp_url, tokens=tokens), topology) as live:
        async with httpx.AsyncClient(
            base_url=live.url, headers={"authorization": f"Bearer {PUBLISHER}"}
        ) as http:
            response = await http.post("/v1/queues/orders/messages", json={"payload": 1})
            assert response.status_code == 201, response.text
        # BANDGATE_TOKEN, or --token.
        env = _env(live.url) | {"BANDGATE_TOKEN": CONSUMER}
        taken = await bandgate(live, "receive", "orders", "--wait", "5", "--ack", env=env)
        assert taken.code == 0, taken.stderr
        assert [m["payload"] for m in taken.messages()] == [1]
        forbidden = await bandgate(live, "receive", "orders", "--wait", "0", "--token", PUBLISHER)
        assert (forbidden.code, forbidden.stdout) == (2, "")
        assert forbidden.stderr.startswith("error: forbidden: ")
        refused = await bandgate(live, "receive", "orders", "--wait", "0", "--token", "wrong")
        assert (refused.code, refused.stdout) == (2, "")
        assert refused.stderr.startswith("error: invalid_token: ")
        assert "wrong" not in refused.stderr  # a token is never echoed

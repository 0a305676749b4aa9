"""`bandgate cancel | replace | escalate` run as a script runs them, as processes, against a
gateway served on a port (authentication on) and a real broker; each test checks what the
bands and the ledger stream hold afterwards, not only what the command printed."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology import naming, wire
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.integration.ledger_reader import entries_through
from tests.integration.live_gateway import LiveGateway

# The HTTP edge (or a CLI over it): the broker matrix leaves it to `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

BANDGATE = str(Path(sys.executable).parent / "bandgate")
PUBLISHER = "cli-publisher"  # publish:*
READER = "cli-reader"  # read:*


@pytest.fixture
def live(broker: TestBroker, amqp_url: str, topology: Topology) -> Iterator[LiveGateway]:
    settings = GatewaySettings(
        amqp_url=amqp_url,
        management_url=broker.management_url,
        host="127.0.0.1",
        port=free_port(),
        access_log=False,
        tokens=(
            TokenSpec(name="app", sha256=hash_token(PUBLISHER), scopes=("publish:*",)),
            TokenSpec(name="dashboard", sha256=hash_token(READER), scopes=("read:*",)),
        ),
    )
    with LiveGateway(settings, topology) as gateway:
        yield gateway


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    def answer(self) -> dict[str, Any]:
        """The one JSON line the command printed."""
        (line,) = self.stdout.splitlines()
        data: dict[str, Any] = json.loads(line)
        return data


async def bandgate(live: LiveGateway, *args: str, token: str | None = PUBLISHER) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "BANDGATE_TOKEN"}
    env |= {"BANDGATE_GATEWAY_URL": live.url} | ({"BANDGATE_TOKEN": token} if token else {})
    process = await asyncio.create_subprocess_exec(
        BANDGATE,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


async def publish(live: LiveGateway, message_id: str, priority: int) -> None:
    async with httpx.AsyncClient(
        base_url=live.url, headers={"authorization": f"Bearer {PUBLISHER}"}
    ) as http:
        response = await http.post(
            "/v1/queues/orders/messages",
            json={"payload": {"v": 1}, "priority": priority, "message_id": message_id},
        )
    assert response.status_code == 201, response.text


async def take_one(connection: AbstractRobustConnection, queue: str) -> AbstractIncomingMessage:
    channel = await connection.channel()
    target = await channel.declare_queue(queue, passive=True)
    message = await target.get(no_ack=True, fail=False)
    await channel.close()
    assert message is not None, f"{queue} is empty"
    return message


async def test_cancel_prints_the_answer_and_writes_the_cancel(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(live, "order-1", 5)
    result = await bandgate(live, "cancel", "orders", "order-1")
    assert (result.code, result.stderr) == (0, "")
    answer = result.answer()
    assert (answer["message_id"], answer["queue"]) == ("order-1", "orders")
    assert answer["note"]
    assert await entries_through(amqp, topology, "cancel", "order-1") == [
        ("cancel", "orders", "order-1", answer["cancelled_before"])
    ]


async def test_replace_sends_payload_priority_and_headers(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(live, "order 2", 1)  # an id the command must quote into the path
    result = await bandgate(
        live, "replace", "orders", "order 2", "--payload", '{"v": 2}', "--priority", "high",
        "--header", "tenant=acme", "--header", "note=a=b", "--gateway", live.url,
    )  # fmt: skip
    assert (result.code, result.stderr) == (0, "")
    answer = result.answer()
    assert (answer["message_id"], answer["band"], answer["priority"]) == ("order 2", "hot", 7)
    copy = await take_one(amqp, "orders.hot")
    assert (copy.message_id, orjson.loads(copy.body)) == ("order 2", {"v": 2})
    assert copy.headers[wire.GENERATION] == answer["generation"]
    assert (copy.headers["tenant"], copy.headers["note"]) == ("acme", "a=b")
    assert await entries_through(amqp, topology, "replace", "order 2") == [
        ("replace", "orders", "order 2", answer["generation"])
    ]


async def test_replace_with_a_delay_goes_through_the_delay_ladder(live: LiveGateway) -> None:
    result = await bandgate(
        live, "replace", "orders", "order-3", "--payload", "[1]", "--delay", "30"
    )
    assert (result.code, result.stderr) == (0, "")
    assert result.answer()["deliver_at"] is not None


async def test_escalate_by_band_lands_a_cold_message_in_the_hot_band(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(live, "order-4", 0)
    result = await bandgate(
        live, "escalate", "orders", "order-4", "--payload", '{"v": 1}', "--band", "hot"
    )
    assert (result.code, result.stderr) == (0, "")
    answer = result.answer()
    assert (answer["band"], answer["priority"]) == ("hot", 9)
    copy = await take_one(amqp, "orders.hot")
    assert (copy.message_id, copy.headers[wire.GENERATION]) == ("order-4", answer["generation"])
    assert await entries_through(amqp, topology, "replace", "order-4") == [
        ("replace", "orders", "order-4", answer["generation"])
    ]


@pytest.mark.parametrize(
    ("args", "token", "code", "expected"),
    [
        (("cancel", "nosuch", "m1"), PUBLISHER, 2, "error: unknown_queue: "),
        (("cancel", "orders", "m1"), READER, 2, "error: forbidden: "),
        (("cancel", "orders", "m1"), None, 2, "error: unauthorized: "),
        (("replace", "orders", "m1", "--payload", "{"), PUBLISHER, 2, "--payload"),
        (("replace", "orders", "m1"), PUBLISHER, 2, "--payload"),
        (("replace", "orders", "m1", "--payload", "1", "--header", "x"), PUBLISHER, 2,
         "--header"),
        (("replace", "orders", "m1", "--payload", "1", "--header", "x-a=1"), PUBLISHER, 2,
         "error: invalid_field: "),
        (("replace", "orders", "m1", "--payload", "1", "--priority", "11"), PUBLISHER, 2,
         "error: invalid_priority: "),
        (("escalate", "orders", "m1", "--payload", "1"), PUBLISHER, 2, "error: missing_field: "),
        (("escalate", "orders", "m1", "--payload", "1", "--band", "hot", "--priority", "9"),
         PUBLISHER, 2, "error: conflicting_fields: "),
        (("escalate", "orders", "m1", "--payload", "1", "--band", "tepid"), PUBLISHER, 2,
         "error: invalid_field: "),
        (("cancel", "orders", "m1", "--gateway", "http://127.0.0.1:1"), PUBLISHER, 1,
         "error: unreachable: "),
    ],
)  # fmt: skip
async def test_bad_input_exits_with_the_error_on_stderr_and_writes_nothing(
    live: LiveGateway,
    amqp: AbstractRobustConnection,
    topology: Topology,
    args: tuple[str, ...],
    token: str | None,
    code: int,
    expected: str,
) -> None:
    result = await bandgate(live, *args, token=token)
    assert (result.code, result.stdout) == (code, "")
    assert expected in result.stderr
    sentinel = await bandgate(live, "cancel", "orders", "sentinel")
    assert sentinel.code == 0, sentinel.stderr
    written = await entries_through(amqp, topology, "cancel", "sentinel")
    assert [entry[:3] for entry in written] == [("cancel", "orders", "sentinel")]


async def test_a_tombstone_not_written_exits_1_after_publishing(
    live: LiveGateway, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    channel = await amqp.channel()
    await channel.queue_delete(naming.ledger_stream(topology.exchange))
    await channel.close()
    result = await bandgate(live, "replace", "orders", "order-5", "--payload", "5")
    assert (result.code, result.stdout) == (1, "")
    assert result.stderr.startswith("error: tombstone_not_written: ")
    copy = await take_one(amqp, "orders.warm")
    assert copy.message_id == "order-5"

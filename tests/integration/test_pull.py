"""HTTP receivers against a real broker: waterfall order, visibility, extend, ack, release,
the delivery limit, long polls and bad input (`bandgate.pull`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.pull.app import create_app
from bandgate.pull.settings import PullSettings
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths

pytestmark = pytest.mark.integration


@pytest.fixture
def topology() -> Topology:
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {},
                "ledger": {
                    "ordered": True,
                    "retry": {"max_attempts": 3, "backoff_initial_seconds": 0.2, "jitter": 0},
                },
                "jobs": {
                    "retry": {
                        "max_attempts": 2,
                        "max_deliveries": 3,
                        "backoff_initial_seconds": 0.2,
                        "jitter": 0,
                    }
                },
            },
        }
    )


@contextlib.asynccontextmanager
async def served(
    settings: GatewaySettings, topology: Topology, pull: PullSettings, **client: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a gateway app with these settings, served in this process."""
    app = create_app(settings, topology, pull=pull)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=30, **client
        ) as http:
            yield http


@pytest.fixture
async def pull(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[httpx.AsyncClient]:
    async with served(gateway_settings, topology, PullSettings(linger_seconds=0.05)) as http:
        yield http


async def publish(http: httpx.AsyncClient, queue: str, **message: Any) -> str:
    response = await http.post(f"/v1/queues/{queue}/messages", json=message)
    assert response.status_code == 201, response.text
    return str(response.json()["message_id"])


async def receive(http: httpx.AsyncClient, queue: str, **asked: Any) -> list[dict[str, Any]]:
    response = await http.post(f"/v1/queues/{queue}/receive", json=asked)
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


async def test_receives_come_hottest_band_first(pull: httpx.AsyncClient) -> None:
    for index in range(30):
        await publish(pull, "orders", payload={"n": index}, priority=(8, 5, 1)[index % 3])
    bands = []
    for _ in range(3):
        got = await receive(pull, "orders", max_messages=10, wait_seconds=1)
        bands += [message["band"] for message in got]
        for message in got:
            assert (
                await pull.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
            ).status_code == 204
    assert bands == ["hot"] * 10 + ["warm"] * 10 + ["cold"] * 10


async def test_a_message_has_every_field(pull: httpx.AsyncClient) -> None:
    sent = await publish(
        pull, "orders", payload={"a": [1, 2]}, priority=7, headers={"x": "y"}, partition_key="k1"
    )
    [message] = await receive(pull, "orders", wait_seconds=2, visibility_timeout=60)
    assert message["message_id"] == sent
    assert message["payload"] == {"a": [1, 2]}
    assert (message["priority"], message["band"], message["attempt"]) == (7, "hot", 1)
    assert message["receive_count"] == 1
    assert message["headers"] == {"x": "y"}
    assert message["partition_key"] == "k1"
    assert message["enqueued_at"].endswith("Z")
    left = _seconds_until(message["visible_until"])
    assert 55 < left <= 60


def _seconds_until(moment: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(moment).timestamp() - time.time()


async def test_an_unacked_message_comes_back_counted_then_dead_letters(
    pull: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    sent = await publish(pull, "jobs", payload={"poison": True}, priority=8)
    counts = []
    for _ in range(3):  # max_deliveries 3: the third lapse is the last receive
        # Leased long enough for the next receive to see it invisible on a loaded machine.
        [message] = await receive(pull, "jobs", wait_seconds=10, visibility_timeout=1)
        assert message["message_id"] == sent
        counts.append(message["receive_count"])
        # Invisible meanwhile.
        assert await receive(pull, "jobs", wait_seconds=0) == []
    assert counts == [1, 2, 3]
    assert await receive(pull, "jobs", wait_seconds=2) == []
    depths = await _wait_for(amqp, topology, "jobs.dlq", 1)
    assert depths["jobs.dlq"] == 1


async def _wait_for(
    amqp: AbstractRobustConnection, topology: Topology, queue: str, count: int
) -> dict[str, int]:
    deadline = time.monotonic() + 30  # a bound for a loaded machine, not a pace
    while True:
        depths = await queue_depths(amqp, topology)
        if depths[queue] >= count or time.monotonic() > deadline:
            return depths
        await asyncio.sleep(0.05)


async def test_metrics_count_leases_and_outcomes(pull: httpx.AsyncClient) -> None:
    await publish(pull, "orders", payload={}, priority=8)
    [message] = await receive(pull, "orders", wait_seconds=2)
    metrics = (await pull.get("/metrics")).text
    assert 'bandgate_leased{queue="orders"} 1.0' in metrics
    # The receiver's slots, sampled once a second: the leased message holds one.
    busy = 'bandgate_consumer_busy_slots{band="hot",queue="orders"} 1.0'
    async with asyncio.timeout(30):
        while busy not in metrics:
            await asyncio.sleep(0.05)
            metrics = (await pull.get("/metrics")).text
    assert (
        await pull.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
    ).status_code == 204
    metrics = (await pull.get("/metrics")).text
    assert 'bandgate_leased{queue="orders"} 0.0' in metrics
    assert 'bandgate_consumed_total{band="hot",outcome="ack",queue="orders"} 1.0' in metrics


async def test_a_client_that_polls_then_sleeps_does_not_wear_messages_out(
    pull: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """The receiver pauses between the polls (linger 0.05 s here): what it held unleased
    must not count as deliveries (RabbitMQ before 4.3 counts every return)."""
    for index in range(10):
        await publish(pull, "jobs", payload={"n": index}, priority=8)
    counts = []
    for _ in range(6):  # more rounds than jobs' max_deliveries (3)
        [message] = await receive(pull, "jobs", wait_seconds=5)
        counts.append(message["receive_count"])
        assert (
            await pull.delete(f"/v1/queues/jobs/receipts/{message['receipt']}")
        ).status_code == 204
        await asyncio.sleep(0.3)  # the client's own pause between polls: the receiver pauses too
    assert counts == [1] * 6
    assert (await queue_depths(amqp, topology))["jobs.dlq"] == 0


async def test_a_paused_process_gives_back_what_it_holds_after_hold_seconds(
    gateway_settings: GatewaySettings,
    topology: Topology,
    amqp: AbstractRobustConnection,
) -> None:
    """One receive of one message prefetches the rest of the band into the process. Once no
    client waits, it pauses and, past `hold_seconds` (at the pause on 4.3), gives them back
    to their band for other processes and workers, uncounted. Before, a process kept
    messages no client had asked for until its next receive or its shutdown."""
    settings = PullSettings(linger_seconds=0.05, hold_seconds=0.2)
    async with served(gateway_settings, topology, settings) as http:
        for index in range(5):
            await publish(http, "orders", payload={"n": index}, priority=1)
        [first] = await receive(http, "orders", wait_seconds=5)
        response = await http.delete(f"/v1/queues/orders/receipts/{first['receipt']}")
        assert response.status_code == 204
        deadline = time.monotonic() + 15
        while (await queue_depths(amqp, topology))["orders.cold"] != 4:
            assert time.monotonic() < deadline, "the process kept what no client asked for"
            await asyncio.sleep(0.05)
        rest = await receive(http, "orders", max_messages=10, wait_seconds=5)
        assert sorted(message["payload"]["n"] for message in rest) == [1, 2, 3, 4]
        assert {message["receive_count"] for message in rest} == {1}
        for message in rest:
            response = await http.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
            assert response.status_code == 204


async def test_extending_keeps_a_message_invisible(pull: httpx.AsyncClient) -> None:
    await publish(pull, "orders", payload={}, priority=8)
    # The first lease outlasts the extend's round trip on a loaded machine.
    [message] = await receive(pull, "orders", wait_seconds=10, visibility_timeout=1.5)
    response = await pull.post(
        "/v1/queues/orders/receipts/extend",
        json={"receipt": message["receipt"], "visibility_timeout": 5},
    )
    assert response.status_code == 200, response.text
    assert _seconds_until(response.json()["visible_until"]) > 4.5
    # Past the first lease's end: still invisible.
    assert await receive(pull, "orders", wait_seconds=2) == []
    assert (
        await pull.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
    ).status_code == 204


async def test_acked_is_gone_and_its_receipt_then_answers_410(
    pull: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(pull, "orders", payload={}, priority=2)
    [message] = await receive(pull, "orders", wait_seconds=2)
    path = f"/v1/queues/orders/receipts/{message['receipt']}"
    assert (await pull.delete(path)).status_code == 204
    again = await pull.delete(path)
    assert again.status_code == 410
    assert again.json()["error"]["code"] == "lease_expired"
    assert await receive(pull, "orders", wait_seconds=0.5) == []
    depths = await queue_depths(amqp, topology)
    assert depths["orders.cold"] == 0


async def test_release_retries_then_dead_letters_after_max_attempts(
    pull: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await publish(pull, "jobs", payload={}, priority=5)
    [first] = await receive(pull, "jobs", wait_seconds=2)
    response = await pull.post(
        "/v1/queues/jobs/receipts/release", json={"receipt": first["receipt"], "reason": "busy"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "retry"
    assert response.json()["attempt"] == 2
    [second] = await receive(pull, "jobs", wait_seconds=5)
    assert second["attempt"] == 2
    response = await pull.post(
        "/v1/queues/jobs/receipts/release", json={"receipt": second["receipt"]}
    )
    assert response.json()["outcome"] == "dead-lettered"
    assert response.json()["cause"] == "max-attempts"
    assert (await _wait_for(amqp, topology, "jobs.dlq", 1))["jobs.dlq"] == 1


async def test_release_to_the_dead_letter_queue_with_a_reason(
    pull: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A client's dead-letter is its decision, logged as a warning: not an error to alert on."""
    await publish(pull, "orders", payload={}, priority=5)
    [message] = await receive(pull, "orders", wait_seconds=2)
    with caplog.at_level(logging.INFO, logger="bandgate"):
        response = await pull.post(
            "/v1/queues/orders/receipts/release",
            json={"receipt": message["receipt"], "dead_letter": True, "reason": "bad sku"},
        )
    assert response.status_code == 200, response.text
    assert response.json()["cause"] == "rejected"
    said = [record for record in caplog.records if message["message_id"] in record.getMessage()]
    assert [record.levelno for record in said] == [logging.WARNING]
    letters = await pull.get("/v1/queues/orders/dlq")
    assert letters.status_code == 200, letters.text
    assert "bad sku" in letters.text


async def test_ack_batch_reports_each_receipt(pull: httpx.AsyncClient) -> None:
    for _ in range(3):
        await publish(pull, "orders", payload={}, priority=8)
    got = await receive(pull, "orders", max_messages=3, wait_seconds=2)
    receipts = [m["receipt"] for m in got] + ["nonsense", got[0]["receipt"]]
    response = await pull.post("/v1/queues/orders/receipts/ack", json={"receipts": receipts})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [item["index"] for item in body["successful"]] == list(range(len(got)))
    assert [(f["index"], f["error"]["code"]) for f in body["failed"]] == [
        (len(got), "invalid_receipt"),
        (len(got) + 1, "lease_expired"),
    ]


async def test_a_batch_ack_settles_its_leases_together_and_the_broker_agrees(
    pull: httpx.AsyncClient, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """The leases of a batch ack end at once and their acks go out together, joined into
    `multiple` acks where the delivery tags allow: acked out of delivery order, with a lease
    still held below some of them and one that lapsed among them, the broker takes every ack
    (a wrong `multiple` ack would close the channel, and the held message would come back),
    and holds exactly the messages not acked."""
    for n in range(12):
        await publish(pull, "orders", payload={"n": n}, priority=8)
    held = await receive(pull, "orders", max_messages=1, wait_seconds=2)
    lapsing = await receive(pull, "orders", max_messages=1, wait_seconds=2, visibility_timeout=0.2)
    batch = await receive(pull, "orders", max_messages=10, wait_seconds=2)
    assert len(batch) == 10
    await asyncio.sleep(0.5)  # the lapsed message is back in its band, counted
    receipts = [m["receipt"] for m in reversed(batch)] + [lapsing[0]["receipt"]]
    response = await pull.post("/v1/queues/orders/receipts/ack", json={"receipts": receipts})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [item["index"] for item in body["successful"]] == list(range(10))
    assert [(f["index"], f["error"]["code"]) for f in body["failed"]] == [(10, "lease_expired")]
    [again] = await receive(pull, "orders", wait_seconds=2)
    assert (again["payload"], again["receive_count"]) == (lapsing[0]["payload"], 2)
    for message in (*held, again):
        gone = await pull.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
        assert gone.status_code == 204, gone.text
    assert await receive(pull, "orders", wait_seconds=0.5) == []
    assert (await queue_depths(amqp, topology))["orders.hot"] == 0


async def test_a_receive_acks_the_previous_batch_first(pull: httpx.AsyncClient) -> None:
    for n in range(4):
        await publish(pull, "orders", payload={"n": n}, priority=8)
    first = await receive(pull, "orders", max_messages=2, wait_seconds=2)
    receipts = [m["receipt"] for m in first]
    response = await pull.post(
        "/v1/queues/orders/receive",
        json={"max_messages": 2, "wait_seconds": 2, "ack": [*receipts, "nonsense", receipts[0]]},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert [m["payload"]["n"] for m in first + body["messages"]] == [0, 1, 2, 3]
    assert [item["index"] for item in body["ack"]["successful"]] == [0, 1]
    assert [
        (f["index"], f["error"]["code"], f["error"]["field"]) for f in body["ack"]["failed"]
    ] == [
        (2, "invalid_receipt", "ack.2"),
        (3, "lease_expired", "ack.3"),
    ]
    # The acked messages are gone: only the two in hand remain, leased.
    for receipt in receipts:
        gone = await pull.delete(f"/v1/queues/orders/receipts/{receipt}")
        assert gone.status_code == 410, gone.text
    last = await pull.post(
        "/v1/queues/orders/receive",
        json={"ack": [m["receipt"] for m in body["messages"]]},
    )
    assert last.status_code == 200, last.text
    assert (last.json()["messages"], len(last.json()["ack"]["successful"])) == ([], 2)
    assert "ack" not in (await pull.post("/v1/queues/orders/receive", json={})).json()


async def test_a_long_poll_returns_soon_after_a_publish(pull: httpx.AsyncClient) -> None:
    # The first receive opens the queue's receiver (mailbox, ledger, subscriptions): seconds on
    # a loaded machine, which the long poll below must not count as its own latency.
    assert await receive(pull, "orders", wait_seconds=0) == []
    waiting = asyncio.create_task(receive(pull, "orders", wait_seconds=20))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing to take: it waits
    started = time.monotonic()
    await publish(pull, "orders", payload={"late": True}, priority=1)
    [message] = await asyncio.wait_for(waiting, 30)
    assert message["payload"] == {"late": True}
    # Answered by the publish, not by its deadline (well under a second on an idle machine).
    assert time.monotonic() - started < 10


async def test_an_empty_wait_returns_an_empty_list_after_the_wait(pull: httpx.AsyncClient) -> None:
    started = time.monotonic()
    assert await receive(pull, "orders", wait_seconds=0.5) == []
    assert 0.45 < time.monotonic() - started < 3


@pytest.fixture
async def kept(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[httpx.AsyncClient]:
    """Receivers whose headroom lasts 30 s after a hotter arrival, so that the test does
    not race its end (`BANDGATE_PULL_COLD_BOOST_SECONDS`)."""
    settings = PullSettings(linger_seconds=0.05, cold_boost_seconds=30)
    async with served(gateway_settings, topology, settings) as http:
        yield http


async def test_cold_leases_leave_receives_waiting_for_hot_messages(
    kept: httpx.AsyncClient,
) -> None:
    """Twelve receives ask while a cold backlog is at hand and hot work flows: some are
    kept waiting (the headroom), and the next hot message goes to one of them at once.
    Without the headroom every receive takes a cold message and the hot one waits for the
    next receive."""
    for index in range(20):
        await publish(kept, "orders", payload={"cold": index}, priority=1)
    await publish(kept, "orders", payload={"hot": 0}, priority=8)
    [first] = await receive(kept, "orders", wait_seconds=2, visibility_timeout=60)
    assert first["payload"] == {"hot": 0}  # a hot arrival: the headroom is on
    asking = [
        asyncio.create_task(
            receive(kept, "orders", max_messages=1, wait_seconds=3, visibility_timeout=60)
        )
        for _ in range(12)
    ]
    await asyncio.wait(asking, return_when=asyncio.FIRST_COMPLETED)  # cold under the floor
    await publish(kept, "orders", payload={"hot": 1}, priority=8)
    got = [message for messages in await asyncio.gather(*asking) for message in messages]
    assert {"hot": 1} in [message["payload"] for message in got]
    cold = [message for message in got if message["band"] == "cold"]
    assert 2 <= len(cold) <= 11  # the floor at least; never every receive
    for message in [first, *got]:
        response = await kept.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
        assert response.status_code == 204


async def test_a_hot_reserve_keeps_a_receive_for_the_first_hot_message_after_a_quiet_spell(
    gateway_settings: GatewaySettings, topology: Topology
) -> None:
    """Four receivers ask for one message each beside a cold backlog, nothing hot for a long
    while (the headroom follows hotter arrivals and is 0 then). Without a reserve each takes a
    cold message and the next hot one waits for a cold lease to end (3 s in the case reported);
    with `BANDGATE_PULL_HOT_RESERVE=1` one receive keeps waiting, and the hot message goes to
    it while every cold lease is still held."""
    settings = PullSettings(linger_seconds=0.05, hot_reserve=1)
    async with served(gateway_settings, topology, settings) as http:
        for index in range(10):
            await publish(http, "orders", payload={"cold": index}, priority=1)
        asking = [
            asyncio.create_task(
                receive(http, "orders", max_messages=1, wait_seconds=15, visibility_timeout=60)
            )
            for _ in range(4)
        ]
        pending = set(asking)
        while len(pending) > 1:  # three take cold messages; the reserve keeps the fourth
            _, pending = await asyncio.wait(pending, timeout=15, return_when="FIRST_COMPLETED")
            assert pending, "every receive took a cold message"
        held = [message for task in asking if task.done() for message in task.result()]
        assert [message["band"] for message in held] == ["cold"] * 3
        await publish(http, "orders", payload={"hot": 0}, priority=8)
        [hot] = await pending.pop()
        assert hot["payload"] == {"hot": 0}
        for message in [*held, hot]:  # settled only now: the cold leases were held throughout
            response = await http.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
            assert response.status_code == 204


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/queues/orders/receive", {"max_messages": 0}, 422, "invalid_field"),
        ("/v1/queues/orders/receive", {"max_messages": 11}, 422, "invalid_field"),
        ("/v1/queues/orders/receive", {"wait_seconds": 21}, 422, "invalid_field"),
        ("/v1/queues/orders/receive", {"visibility_timeout": 0}, 422, "invalid_field"),
        ("/v1/queues/orders/receive", {"visibility_timeout": 43_201}, 422, "invalid_field"),
        ("/v1/queues/orders/receive", {"max_messages": "3"}, 422, "invalid_field"),
        ("/v1/queues/orders/receive", {"nope": 1}, 422, "unknown_field"),
        ("/v1/queues/orders/receive", [], 422, "invalid_body"),
        ("/v1/queues/nosuch/receive", {}, 404, "unknown_queue"),
        ("/v1/queues/orders/receipts/extend", {"receipt": "x"}, 422, "missing_field"),
        (
            "/v1/queues/orders/receipts/extend",
            {"receipt": "x", "visibility_timeout": 5},
            422,
            "invalid_receipt",
        ),
        (
            "/v1/queues/orders/receipts/release",
            {"receipt": "0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAAA", "delay_seconds": -1},
            422,
            "invalid_field",
        ),
        (
            "/v1/queues/orders/receipts/release",
            {"receipt": "r", "delay_seconds": 1, "dead_letter": True},
            422,
            "conflicting_fields",
        ),
        ("/v1/queues/orders/receipts/ack", {"receipts": []}, 422, "invalid_field"),
        ("/v1/queues/orders/receipts/ack", {"receipts": ["r"] * 101}, 413, "batch_too_large"),
        ("/v1/queues/orders/receive", {"ack": ["r"] * 101}, 413, "batch_too_large"),
        ("/v1/queues/orders/receive", {"ack": "r"}, 422, "invalid_field"),
    ],
)
async def test_bad_input_gets_the_documented_error(
    pull: httpx.AsyncClient, path: str, body: Any, status: int, code: str
) -> None:
    response = await pull.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


async def test_a_forged_receipt_is_refused(pull: httpx.AsyncClient) -> None:
    await publish(pull, "orders", payload={}, priority=8)
    [message] = await receive(pull, "orders", wait_seconds=2)
    replica, lease, signature = message["receipt"].split(".")
    for forged in (
        f"{replica}.{int(lease) + 1}.{signature}",
        f"{replica}.{lease}.{'A' * 22}",
    ):
        response = await pull.delete(f"/v1/queues/orders/receipts/{forged}")
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "invalid_receipt"
    # Another queue's path: the signature covers the queue.
    response = await pull.delete(f"/v1/queues/jobs/receipts/{message['receipt']}")
    assert response.json()["error"]["code"] == "invalid_receipt"
    assert (
        await pull.delete(f"/v1/queues/orders/receipts/{message['receipt']}")
    ).status_code == 204


async def test_a_dead_replicas_receipt_answers_410(pull: httpx.AsyncClient) -> None:
    response = await pull.delete(
        "/v1/queues/orders/receipts/0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAAA"
    )
    assert response.status_code == 410, response.text
    assert response.json()["error"]["code"] == "lease_lost"


async def test_an_ordered_queue_leases_one_message_per_key_at_a_time(
    pull: httpx.AsyncClient,
) -> None:
    for index in range(3):
        await publish(pull, "ledger", payload={"n": index}, priority=5, partition_key="acct-1")
    await publish(pull, "ledger", payload={"n": "other"}, priority=5, partition_key="acct-2")
    got = await receive(pull, "ledger", max_messages=10, wait_seconds=2)
    # One per key: acct-1's first, and acct-2's.
    assert sorted(str(m["payload"]["n"]) for m in got) == ["0", "other"]
    first = next(m for m in got if m["payload"]["n"] == 0)
    assert await receive(pull, "ledger", max_messages=10, wait_seconds=0.3) == []
    # Released: retried in place after its back-off, before the key's next message.
    response = await pull.post(
        "/v1/queues/ledger/receipts/release", json={"receipt": first["receipt"]}
    )
    assert response.json()["outcome"] == "retry"
    [again] = await receive(pull, "ledger", max_messages=10, wait_seconds=5)
    assert (again["payload"], again["attempt"]) == ({"n": 0}, 2)
    order = [0]
    receipt = again["receipt"]
    for _ in range(2):
        assert (await pull.delete(f"/v1/queues/ledger/receipts/{receipt}")).status_code == 204
        [following] = await receive(pull, "ledger", max_messages=10, wait_seconds=5)
        order.append(following["payload"]["n"])
        receipt = following["receipt"]
    assert order == [0, 1, 2]


CONSUMER = "consumer-secret"  # publish:orders, consume:orders
PUBLISHER = "publisher-secret"  # publish:orders


def with_tokens(
    settings: GatewaySettings, *tokens: tuple[str, str, tuple[str, ...]]
) -> GatewaySettings:
    """`settings` with authentication on and these tokens: (name, secret, scopes) each."""
    specs = tuple(
        TokenSpec(name=name, sha256=hash_token(secret), scopes=scopes)
        for name, secret, scopes in tokens
    )
    return settings.model_copy(update={"auth_enabled": True, "tokens": specs})


@pytest.fixture
async def limited(
    gateway_settings: GatewaySettings, topology: Topology
) -> AsyncIterator[httpx.AsyncClient]:
    """Authentication on; 3 leases per token; receive responses cut at 1 KiB of payloads."""
    settings = with_tokens(
        gateway_settings,
        ("worker", CONSUMER, ("publish:orders", "consume:orders")),
        ("producer", PUBLISHER, ("publish:orders",)),
    )
    pull_settings = PullSettings(max_leases_per_token=3, max_response_bytes=1024)
    bearer = {"authorization": f"Bearer {CONSUMER}"}
    async with served(settings, topology, pull_settings, headers=bearer) as http:
        yield http


async def test_receiving_needs_the_consume_scope(limited: httpx.AsyncClient) -> None:
    producer = {"authorization": f"Bearer {PUBLISHER}"}
    for path, body in (
        ("/v1/queues/orders/receive", {}),
        ("/v1/queues/orders/receipts/ack", {"receipts": ["r"]}),
        ("/v1/queues/orders/receipts/extend", {"receipt": "r", "visibility_timeout": 1}),
    ):
        response = await limited.post(path, json=body, headers=producer)
        assert response.status_code == 403, response.text
        assert "consume:orders" in response.json()["error"]["message"]
    response = await limited.delete("/v1/queues/orders/receipts/r", headers=producer)
    assert response.status_code == 403
    wrong = {"authorization": "Bearer not-a-token"}
    response = await limited.post("/v1/queues/orders/receive", json={}, headers=wrong)
    assert response.status_code == 401


async def test_a_token_holds_at_most_its_leases(limited: httpx.AsyncClient) -> None:
    for _ in range(5):
        await publish(limited, "orders", payload={}, priority=8)
    got = await receive(limited, "orders", max_messages=10, wait_seconds=2)
    assert len(got) == 3  # stopped at the token's limit
    response = await limited.post("/v1/queues/orders/receive", json={"wait_seconds": 0})
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "too_many_leases"
    assert response.headers["retry-after"] == "1"
    assert (
        await limited.delete(f"/v1/queues/orders/receipts/{got[0]['receipt']}")
    ).status_code == 204
    assert len(await receive(limited, "orders", max_messages=10, wait_seconds=2)) == 1


OTHER_CONSUMER = "other-consumer-secret"  # consume:orders, another tenant's worker


async def test_one_token_leaves_half_a_queues_leases_to_the_others(
    gateway_settings: GatewaySettings, topology: Topology
) -> None:
    """Issue 33, finding 6: with a per-token limit above the queue's lease cap, one token took
    every lease of the queue and another consumer got nothing. A token's limit is at most half
    of the queue's cap (here 4 leases: 2 per token, whatever the per-token setting says)."""
    settings = with_tokens(
        gateway_settings,
        ("hoarder", CONSUMER, ("publish:orders", "consume:orders")),
        ("other", OTHER_CONSUMER, ("consume:orders",)),
    )
    pull_settings = PullSettings(max_leases=4, max_leases_per_token=1000)
    hoarder = {"authorization": f"Bearer {CONSUMER}"}
    other = {"authorization": f"Bearer {OTHER_CONSUMER}"}
    async with served(settings, topology, pull_settings, headers=hoarder) as http:
        for n in range(4):
            await publish(http, "orders", payload={"n": n}, priority=8)
        taken = await receive(http, "orders", max_messages=10, wait_seconds=2)
        assert len(taken) == 2
        refused = await http.post("/v1/queues/orders/receive", json={"wait_seconds": 0})
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_leases"
        response = await http.post(
            "/v1/queues/orders/receive",
            json={"max_messages": 10, "wait_seconds": 2},
            headers=other,
        )
        assert response.status_code == 200, response.text
        theirs = response.json()["messages"]
        assert len(theirs) == 2
        ids = {m["message_id"] for m in taken} | {m["message_id"] for m in theirs}
        assert len(ids) == 4


async def test_a_response_stops_at_its_byte_budget(limited: httpx.AsyncClient) -> None:
    for _ in range(3):
        await publish(limited, "orders", payload="x" * 600, priority=8)
    first = await receive(limited, "orders", max_messages=3, wait_seconds=2)
    assert len(first) == 2  # 600 + 600 bytes reach the 1 KiB budget; the first always comes
    second = await receive(limited, "orders", max_messages=3, wait_seconds=2)
    assert len(second) == 1

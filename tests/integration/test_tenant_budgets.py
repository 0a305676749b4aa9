"""Per-token budgets against a real broker (issue 33): each test replays a finding of the
hostile probe, one tenant against another, and checks that the other tenant is unharmed.
The budgets are documented in docs/guides/limits.md, which names these tests."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.budgets import Seats
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.pull.app import create_app
from bandgate.pull.settings import PullSettings
from bandgate.topology import naming
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway

pytestmark = pytest.mark.integration

NOISY = "tenant-a-secret"  # publish:tenant-a, consume:tenant-a
QUIET = "tenant-b-secret"  # publish:tenant-b, consume:tenant-b
TOKENS = (
    TokenSpec(
        name="tenant-a",
        sha256=hash_token(NOISY),
        scopes=("publish:tenant-a", "consume:tenant-a"),
    ),
    TokenSpec(
        name="tenant-b",
        sha256=hash_token(QUIET),
        scopes=("publish:tenant-b", "consume:tenant-b"),
    ),
)


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@pytest.fixture
def topology() -> Topology:
    """Two tenants' queues, and a ledger of its own (the smallest the model allows: 1 MiB,
    about 3,600 entries), so that a flood of cancels reaches its byte limit quickly."""
    return parse_topology(
        {
            "exchange": "budgets",
            "delay": {"base_ms": 50, "levels": 12},
            "ledger": {"max_bytes": 1 << 20},
            "queues": {"tenant-a": {}, "tenant-b": {}},
        }
    )


@pytest.fixture
def secured(gateway_settings: GatewaySettings) -> GatewaySettings:
    return gateway_settings.model_copy(
        update={"auth_enabled": True, "tokens": TOKENS, "access_log": False}
    )


# -- finding 1: waiting receives --------------------------------------------------------------

CONNECTIONS = 16  # the test gateway's process limit: 4 receives per token, 8 in all


async def long_poll(url: str, queue: str) -> httpx.Response:
    """One long poll of tenant A on a connection of its own, closed after the answer."""
    async with httpx.AsyncClient(base_url=url, headers=bearer(NOISY), timeout=60) as http:
        return await http.post(
            f"/v1/queues/{queue}/receive",
            json={"max_messages": 10, "wait_seconds": 20},
            headers={"connection": "close"},
        )


async def seated_or_refused(poll: asyncio.Task[httpx.Response], seats: Seats, before: int) -> None:
    """Until the gateway seated `poll` (tenant A's seats grew past `before`) or answered it."""
    async with asyncio.timeout(30):
        # The seats belong to the gateway's loop, in its own thread: no event to await here.
        while not poll.done() and seats.held("tenant-a") <= before:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_one_tokens_long_polls_leave_the_process_to_the_others(
    secured: GatewaySettings, topology: Topology
) -> None:
    """Finding 1: one token's empty long polls took every connection of a gateway process,
    and other tenants' publishes got 503. Here the process serves 16 connections; tenant A
    opens 16 long polls, one after the other, enough to take them all: 4 wait (its budget, a
    quarter of the process), the other 12 are refused at once with 429 `too_many_receives`,
    and while A's 4 still wait, every publish and receive of tenant B succeeds."""
    settings = secured.model_copy(update={"port": free_port(), "max_connections": CONNECTIONS})
    assert PullSettings().receive_seats(CONNECTIONS) == (4, 8)
    polls: list[asyncio.Task[httpx.Response]] = []
    with LiveGateway(settings, topology) as live:
        app = live.server.config.app
        assert isinstance(app, Starlette)
        seats: Seats = app.state.receivers.seats
        try:
            for _ in range(CONNECTIONS):
                polls.append(asyncio.create_task(long_poll(live.url, "tenant-a")))
                await seated_or_refused(polls[-1], seats, seats.held("tenant-a"))
            waiting = [poll for poll in polls if not poll.done()]
            async with httpx.AsyncClient(
                base_url=live.url, headers=bearer(QUIET), timeout=30
            ) as quiet:
                await tenant_b_publishes_and_receives(quiet)
                metrics = (await quiet.get("/metrics")).text
            assert len(waiting) == 4
            assert all(not poll.done() for poll in waiting)  # A's polls held on throughout
            refused = [poll.result() for poll in polls if poll not in waiting]
            assert {r.status_code for r in refused} == {429}, [r.text for r in refused]
            assert {r.json()["error"]["code"] for r in refused} == {"too_many_receives"}
            assert all(r.headers["retry-after"] == "1" for r in refused)
        finally:
            for poll in polls:
                poll.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
    refusals = 'bandgate_token_refused_total{code="too_many_receives",token="tenant-a"} 12.0'
    assert refusals in metrics
    assert "bandgate_receives_open 4.0" in metrics


async def tenant_b_publishes_and_receives(http: httpx.AsyncClient) -> None:
    sent = set()
    for n in range(10):
        response = await http.post("/v1/queues/tenant-b/messages", json={"payload": {"n": n}})
        assert response.status_code == 201, response.text
        sent.add(response.json()["message_id"])
    received: set[str] = set()
    while received != sent:
        response = await http.post(
            "/v1/queues/tenant-b/receive", json={"max_messages": 10, "wait_seconds": 5}
        )
        assert response.status_code == 200, response.text
        messages: list[dict[str, Any]] = response.json()["messages"]
        assert messages, f"received {len(received)} of {len(sent)}"
        for message in messages:
            received.add(message["message_id"])
            acked = await http.delete(f"/v1/queues/tenant-b/receipts/{message['receipt']}")
            assert acked.status_code == 204, acked.text


# -- finding 2: tombstones ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def gateway(
    settings: GatewaySettings, topology: Topology, pull: PullSettings | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a gateway process (with HTTP receivers) started for it."""
    app = create_app(settings, topology, pull=pull or PullSettings(linger_seconds=0.05))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=30
        ) as http:
            yield http


async def test_one_tokens_cancels_leave_another_tenants_tombstone_in_the_ledger(
    secured: GatewaySettings, topology: Topology
) -> None:
    """Finding 2: tenant A's 12,000 cancels of random ids pushed tenant B's tombstone out of
    the ledger stream (trimmed by bytes), and a gateway started afterwards handed out B's
    cancelled message. Here the ledger keeps 1 MiB (about 3,600 entries) and a token may
    write 100 tombstones: A's first 100 cancels are written, the other 11,900 refused with
    429 `too_many_tombstones`, and a fresh gateway still skips B's cancelled message."""
    settings = secured.model_copy(update={"max_tombstones_per_token": 100})
    async with gateway(settings, topology) as http:
        published = await http.post(
            "/v1/queues/tenant-b/messages",
            json={"payload": "cancel me", "message_id": "b-1"},
            headers=bearer(QUIET),
        )
        assert published.status_code == 201, published.text
        cancelled = await http.delete("/v1/queues/tenant-b/messages/b-1", headers=bearer(QUIET))
        assert cancelled.status_code == 202, cancelled.text
        statuses: collections.Counter[int] = collections.Counter()
        codes: collections.Counter[str] = collections.Counter()
        for _ in range(120):
            answers = await asyncio.gather(
                *(
                    http.delete(
                        f"/v1/queues/tenant-a/messages/{uuid.uuid4().hex}", headers=bearer(NOISY)
                    )
                    for _ in range(100)
                )
            )
            statuses.update(answer.status_code for answer in answers)
            codes.update(answer.json().get("error", {}).get("code", "") for answer in answers)
        assert statuses == {202: 100, 429: 11_900}
        assert codes["too_many_tombstones"] == 11_900
        metrics = (await http.get("/metrics")).text
    refusals = 'bandgate_token_refused_total{code="too_many_tombstones",token="tenant-a"} 11900.0'
    assert refusals in metrics
    async with gateway(settings, topology) as fresh:
        response = await fresh.post(
            "/v1/queues/tenant-b/receive",
            json={"max_messages": 10, "wait_seconds": 1},
            headers=bearer(QUIET),
        )
        assert response.status_code == 200, response.text
        assert response.json()["messages"] == []  # skipped: the cancel holds
        assert (await fresh.get("/readyz")).json()["ledger"] == "following"
        skipped = (await fresh.get("/metrics")).text
    assert consumed(skipped, "tenant-b", "cancelled") == 1


# -- finding 3: prefetched bytes ---------------------------------------------------------------


async def test_one_small_receive_holds_at_most_the_byte_budget(
    secured: GatewaySettings, topology: Topology, amqp: AbstractRobustConnection
) -> None:
    """Finding 3: 300 messages of 250 KB, then one receive of one message: the gateway took
    all of them from the broker (prefetch 256 per band), and held them. Each band's prefetch
    now follows a byte budget: here 1 MiB per queue with bodies of at most 64 KiB gives 10
    per band (the floor: one full receive); after one receive of one message the broker
    counts at most 10 of 60 messages of 60 KB away from the band, the one leased included."""
    pull = PullSettings(max_prefetch_bytes=1 << 20, linger_seconds=0.05)
    assert secured.max_body_bytes == 64 * 1024
    assert pull.queue_leases(len(topology.queues["tenant-a"].bands), secured.max_body_bytes) == 10
    payload = "x" * 60_000
    async with gateway(secured, topology, pull) as http:
        for n in range(60):
            response = await http.post(
                "/v1/queues/tenant-a/messages",
                json={"payload": payload, "priority": 5, "message_id": f"big-{n}"},
                headers=bearer(NOISY),
            )
            assert response.status_code == 201, response.text
        assert (await queue_depths(amqp, topology))["tenant-a.warm"] == 60
        response = await http.post(
            "/v1/queues/tenant-a/receive",
            json={"max_messages": 1, "wait_seconds": 5},
            headers=bearer(NOISY),
        )
        assert response.status_code == 200, response.text
        assert [m["message_id"] for m in response.json()["messages"]] == ["big-0"]
        # The receive returned once each band's first prefetch was in hand (`runner.open`).
        held = 60 - (await queue_depths(amqp, topology))["tenant-a.warm"]
    assert 1 <= held <= 10
    assert held * len(payload) <= pull.max_prefetch_bytes


# -- finding 5: a graceful shutdown is not a delivery ----------------------------------------


async def lease_one(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.post(
        "/v1/queues/tenant-a/receive",
        json={"max_messages": 10, "wait_seconds": 10, "visibility_timeout": 600},
        headers=bearer(NOISY),
    )
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    assert [m["message_id"] for m in messages] == ["healthy"]
    return messages[0]


async def test_graceful_restarts_with_a_message_leased_do_not_dead_letter_it(
    secured: GatewaySettings, topology: Topology, amqp: AbstractRobustConnection
) -> None:
    """Finding 5: on RabbitMQ before 4.3 every return counts in `x-delivery-count`, a
    graceful shutdown's too; a message leased through 5 restarts of its gateway (a rolling
    deploy) was dead-lettered for `delivery-limit` (`max_deliveries` 5), though no client
    failed it. A stopping gateway now gives it back as a copy that keeps the count without
    this return (on 4.3 a nack, which 4.3 does not count): after 5 restarts it is received
    a 6th time, as received once."""
    async with gateway(secured, topology) as http:
        published = await http.post(
            "/v1/queues/tenant-a/messages",
            json={"payload": {"ok": True}, "message_id": "healthy"},
            headers=bearer(NOISY),
        )
        assert published.status_code == 201, published.text
        await lease_one(http)
    for _ in range(4):
        async with gateway(secured, topology) as http:
            assert (await lease_one(http))["receive_count"] == 1
    async with gateway(secured, topology) as http:
        message = await lease_one(http)
        assert message["receive_count"] == 1
        acked = await http.delete(
            f"/v1/queues/tenant-a/receipts/{message['receipt']}", headers=bearer(NOISY)
        )
        assert acked.status_code == 204, acked.text
    depths = await queue_depths(amqp, topology)
    assert depths["tenant-a.dlq"] == 0
    assert sum(depth for name, depth in depths.items() if name.startswith("tenant-a")) == 0


# -- dead-letter operations ------------------------------------------------------------------

OPS = "ops-secret"  # admin
OTHER_OPS = "other-ops-secret"  # admin


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(30):
        # The gateway's state, which no event announces: looked at between its steps.
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_one_token_runs_its_dead_letter_operations_and_leaves_the_others_theirs(
    secured: GatewaySettings, topology: Topology, amqp: AbstractRobustConnection
) -> None:
    """A dead-letter operation holds a channel, the queue's lock and, for a slow replay, a
    connection for hours. With one operation per token, a token replaying one queue slowly
    is refused a second one at once (429 `too_many_dlq_operations`), another admin token is
    not, and the seat comes back when the replay ends (here: its client leaves)."""
    tokens = (
        TokenSpec(name="ops", sha256=hash_token(OPS), scopes=("admin",)),
        TokenSpec(name="other-ops", sha256=hash_token(OTHER_OPS), scopes=("admin",)),
    )
    settings = secured.model_copy(update={"tokens": tokens, "max_dlq_operations_per_token": 1})
    app = create_app(settings, topology)
    async with app.router.lifespan_context(app):  # the topology declared
        channel = await amqp.channel()
        for n in range(3):
            await channel.default_exchange.publish(
                aio_pika.Message(b"{}", message_id=f"dead-{n}"),
                routing_key=naming.dead_letter_queue("tenant-a"),
            )
        await channel.close()
        seats: Seats = app.state.dlq_seats
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway", timeout=60
        ) as http:
            slow = asyncio.create_task(
                http.post(
                    "/v1/queues/tenant-a/dlq/replay",
                    json={"rate": 0.1, "limit": 3},
                    headers=bearer(OPS),
                )
            )
            await until(lambda: seats.held("ops") == 1 or slow.done())
            assert not slow.done(), slow.result().text
            refused = await http.get("/v1/queues/tenant-b/dlq", headers=bearer(OPS))
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "too_many_dlq_operations"
            assert refused.headers["retry-after"] == "1"
            theirs = await http.get("/v1/queues/tenant-b/dlq", headers=bearer(OTHER_OPS))
            assert theirs.status_code == 200, theirs.text
            assert not slow.done()
            slow.cancel()
            await asyncio.gather(slow, return_exceptions=True)
            await until(lambda: seats.held("ops") == 0)
            again = await http.get("/v1/queues/tenant-a/dlq", headers=bearer(OPS))
            assert again.status_code == 200, again.text


def consumed(metrics: str, queue: str, outcome: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "bandgate_consumed_total"
        and sample.labels.get("queue") == queue
        and sample.labels.get("outcome") == outcome
    )

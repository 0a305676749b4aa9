"""Schemathesis over the whole OpenAPI document, against a real gateway with authentication on:
no 5xx, every response as documented, and the broker holds exactly what the answers say: every
message answered 201 (or listed as successful in a batch), less those acked over HTTP and those
a purge removed.

The run is schemathesis' own engine, what `st run` does (coverage, fuzzing and stateful phases
over every operation), rather than its pytest plugin: one run, so that the broker's count can be
compared with every answer at its end. (`schemathesis.pytest.from_fixture` also fails on
pytest 9.2, which no longer has `Node._nodeid`.)

The checks are those of the document's responses. `positive_data_acceptance` and
`negative_data_rejection` are left out: JSON Schema cannot say some of what the gateway refuses
(Python's idea of a printable message id, `1.0` given for an integer, the delay horizon of a
`deliver_at`), and a batch answers 200 with per-message errors for messages the schema calls
invalid, by design.

The document is the one the gateway serves, its HTTP receivers' operations included
(`bandgate.pull.openapi`). Their messages move, and each move is counted or keeps a message
where it is counted: a receive leases (unacked: the broker counts it ready again once the
gateway closes, as a lapse or a close returns it); an ack (204, or `successful` in a batch)
removes it; a release retries it through the delay ladder or dead-letters it, as the lease's
lapse after `max_deliveries` does; a replay moves dead letters back to their bands; a purge
removes what it reports. So the gateway is closed before the count, and every band, delay level
and dead-letter queue is counted. The stateful phase follows the document's links from a
receive to ack, release and extend, so their answers with real receipts are fuzzed too.

A receive waits up to `wait_seconds` (20 s at most) when nothing is at hand, and leases for up
to 12 h: the `brief` hook shortens both, else the run would take minutes and hold every message
from the first receives on. Values outside the documented ranges are sent as they are.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, get_args

import aio_pika
import httpx
import pytest
import schemathesis
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import AuthContext, BaseSchema, Case, HookContext, Response
from schemathesis.engine import Status, events, from_schema

from bandgate.core.ledger import Verdict
from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.pull.settings import MAX_VISIBILITY_SECONDS, MAX_WAIT_SECONDS
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway

# The HTTP edge (or a CLI over it): the broker matrix leaves it to `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

ADMIN = "admin-secret"
PUBLISHER = "publisher-secret"  # publish:orders
READER = "reader-secret"  # read:*
CONSUMER = "consumer-secret"  # consume:orders
WRONG = "not-a-token"
# Who sends a request is decided by the request itself, so that a case Hypothesis replays
# while it shrinks is sent by the same caller. Admin most often: it may call everything. A
# request with nothing that varies (GET /v1/queues, the stats of one queue) always has the
# same caller: here the last, admin (a wrong token there would leave them 401 all run long).
CALLERS = (ADMIN, ADMIN, PUBLISHER, READER, CONSUMER, WRONG, ADMIN)
# What `brief` cuts a valid wait and visibility timeout to.
WAIT_SECONDS = 0.1
VISIBILITY_SECONDS = 1.0

SEED = 20261123
MAX_EXAMPLES = 100  # per operation in the fuzzing phase; the coverage phase adds its own cases
# Fewer for the receivers, which random data rarely gets past their first check: a receipt
# only the stateful phase can know (from a receive, by the document's links), and a receive
# whose every field is a number in a range. Each 100 examples cost about 1.5 s here.
FEWER_EXAMPLES = ((("receive",), 50), (("ack", "ack_batch", "release", "extend"), 25))

CHECKS = {
    "enabled": False,
    "not_a_server_error": {"enabled": True},
    "status_code_conformance": {"enabled": True},
    "content_type_conformance": {"enabled": True},
    "response_headers_conformance": {"enabled": True},
    "response_schema_conformance": {"enabled": True},
}


@dataclass
class Ledger:
    """Every answer of the run, and how many messages they say the broker holds."""

    requests: int = 0
    accepted: int = 0
    purged: int = 0
    acked: int = 0
    received: int = 0
    extended: int = 0
    skipped: int = 0  # copies the receivers acked unrun: cancelled or superseded (the ledger)
    statuses: Counter[int] = field(default_factory=Counter)
    released: Counter[str] = field(default_factory=Counter)

    def record(self, case: Case[Any], response: Response) -> None:
        self.requests += 1
        self.statuses[response.status_code] += 1
        path = case.operation.path
        status = response.status_code
        if status == 201:
            self.accepted += 1
        elif status == 200 and path.endswith("/messages/batch"):
            self.accepted += len(response.json()["successful"])
        elif status == 200 and path.endswith("/dlq") and case.method.upper() == "DELETE":
            self.purged += response.json()["purged"]
        elif status == 204 and path.endswith("/receipts/{receipt}"):
            self.acked += 1
        elif status == 200 and path.endswith("/receipts/ack"):
            self.acked += len(response.json()["successful"])
        elif status == 200 and path.endswith("/receive"):
            self.received += len(response.json()["messages"])
        elif status == 200 and path.endswith("/receipts/release"):
            self.released[response.json()["outcome"]] += 1
        elif status == 200 and path.endswith("/receipts/extend"):
            self.extended += 1

    @property
    def expected(self) -> int:
        return self.accepted - self.purged - self.acked - self.skipped


class Callers:
    """Bearer tokens for schemathesis: admin, publish:orders, read:* or an unknown one."""

    def get(self, case: Case[Any], ctx: AuthContext) -> str:
        body = case.body if isinstance(case.body, (dict, list, str, int, float, bool)) else None
        key = repr((case.method, case.formatted_path, sorted(case.query.items()), body))
        return CALLERS[zlib.crc32(key.encode()) % len(CALLERS)]

    def set(self, case: Case[Any], data: str, ctx: AuthContext) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


def brief(context: HookContext, case: Case[Any], **kwargs: Any) -> None:
    """`before_call`: a valid wait or visibility timeout cut to `WAIT_SECONDS` and
    `VISIBILITY_SECONDS` (invalid ones go as they are, to be refused)."""
    path = case.operation.path
    if not isinstance(case.body, dict):
        return
    if path.endswith("/receive"):
        _cut(case.body, "wait_seconds", MAX_WAIT_SECONDS, WAIT_SECONDS)
    if path.endswith(("/receive", "/receipts/extend")):
        _cut(case.body, "visibility_timeout", MAX_VISIBILITY_SECONDS, VISIBILITY_SECONDS)


def _cut(body: dict[str, Any], name: str, high: float, to: float) -> None:
    value = body.get(name)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and to < value <= high:
        body[name] = to


@contextmanager
def briefly() -> Iterator[None]:
    """`brief` as a `before_call` hook (schemathesis runs only global ones) for a while."""
    schemathesis.hook("before_call")(brief)
    try:
        yield
    finally:
        schemathesis.hooks.unregister(brief)


@pytest.fixture
def secured_settings(gateway_settings: GatewaySettings) -> GatewaySettings:
    return gateway_settings.model_copy(
        update={
            "port": free_port(),
            "access_log": False,
            "auth_enabled": True,
            # Every fifth request has an unknown token: the per-address limit on failed
            # authentications would soon answer everything with 429.
            "auth_failures_per_minute": 1_000_000,
            "tokens": (
                TokenSpec(name="ops", sha256=hash_token(ADMIN), scopes=("admin",)),
                TokenSpec(name="app", sha256=hash_token(PUBLISHER), scopes=("publish:orders",)),
                TokenSpec(name="dashboard", sha256=hash_token(READER), scopes=("read:*",)),
                TokenSpec(name="worker", sha256=hash_token(CONSUMER), scopes=("consume:orders",)),
            ),
        }
    )


def load(url: str, topology: Topology) -> BaseSchema:
    """The document the gateway at `url` serves, aimed at it."""
    config = schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "base-url": url,
            "workers": 1,
            "request-timeout": 30,
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "deterministic": True,
                "database": "none",
            },
            "checks": CHECKS,
            # Mostly queues that exist: else nearly every request would end at 404.
            "dictionaries": {"queues": {"values": list(topology.queues)}},
            "parameters": {"path.queue": {"dictionary": "queues", "probability": 0.9}},
            "operations": [
                {
                    "include-operation-id": list(ids),
                    "generation": {"max-examples": examples},
                }
                for ids, examples in FEWER_EXAMPLES
            ],
        }
    )
    document = httpx.get(f"{url}/openapi.json").raise_for_status().json()
    schema = schemathesis.openapi.from_dict(document, config=config)
    schema.auth(refresh_interval=None, retry_on=[])(Callers)
    return schema


def run(schema: BaseSchema) -> list[str]:
    """Run every phase over every operation; each distinct problem found, with its request."""
    problems: dict[str, str] = {}
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for checks in event.recorder.checks.values():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        failure = check.failure_info.failure
                        key = f"{event.recorder.label}: {failure.title}: {failure.message}"
                        problems.setdefault(key, check.failure_info.code_sample)
        elif isinstance(event, events.NonFatalError):
            problems.setdefault(f"{event.label}: {event.info.title}", str(event.info))
        elif isinstance(event, events.FatalError):
            raise event.exception
    return [f"{key}\n    {sample}" for key, sample in problems.items()]


def skipped(metrics: str) -> int:
    """Copies the gateway's receivers acked without leasing them, as its metrics count them:
    a cancel, replace or escalate of the run tombstoned them."""
    total = 0.0
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == "bandgate_consumed_total" and sample.labels["outcome"] in get_args(
                Verdict
            ):
                total += sample.value
    return int(total)


async def settled_depths(amqp_url: str, topology: Topology, expected: int) -> dict[str, int]:
    """The queues' depths once they add up to `expected`, or after 30 s (a bound for a loaded
    machine): a delayed message between two levels of the ladder may be counted in neither for
    a moment."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        deadline = time.monotonic() + 30
        while True:
            depths = await queue_depths(connection, topology)
            if sum(depths.values()) == expected or time.monotonic() > deadline:
                return depths
            await asyncio.sleep(0.2)


def test_whole_document_never_5xx_and_the_broker_holds_what_the_answers_say(
    secured_settings: GatewaySettings,
    topology: Topology,
    amqp_url: str,
) -> None:
    ledger = Ledger()
    with LiveGateway(secured_settings, topology) as live, briefly():
        schema = load(live.url, topology)
        started = time.monotonic()

        @schema.hook
        def after_call(context: HookContext, case: Case[Any], response: Response) -> None:
            ledger.record(case, response)

        problems = run(schema)
        ran = time.monotonic() - started
        ledger.skipped = skipped(httpx.get(f"{live.url}/metrics").raise_for_status().text)
    # Closed: every lease the run left open is back in its band.
    held = asyncio.run(settled_depths(amqp_url, topology, ledger.expected))
    where = {name: count for name, count in held.items() if count}
    print(
        f"schemathesis: {ledger.requests} requests in {ran:.1f} s, "
        f"statuses {dict(sorted(ledger.statuses.items()))}, {ledger.accepted} accepted, "
        f"{ledger.received} received, {ledger.acked} acked, {ledger.extended} extended, "
        f"released {dict(ledger.released)}, {ledger.purged} purged, {ledger.skipped} skipped, "
        f"{sum(held.values())} held {where}"
    )
    assert not problems, "\n\n".join(problems)
    assert ledger.requests > 0
    assert ledger.received > 0  # else the count says nothing of the receivers
    assert sum(held.values()) == ledger.expected, held

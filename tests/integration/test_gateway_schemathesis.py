"""Schemathesis over the whole OpenAPI document, against a real gateway with authentication on:
no 5xx, every response as documented, and nothing enqueued except what was answered 201 (or
listed as successful in a batch).

The run is schemathesis' own engine, what `st run` does (coverage, fuzzing and stateful phases
over every operation), rather than its pytest plugin: one run, so that the broker's count can be
compared with every answer at its end. (`schemathesis.pytest.from_fixture` also fails on
pytest 9.2, which no longer has `Node._nodeid`.)

The checks are those of the document's responses. `positive_data_acceptance` and
`negative_data_rejection` are left out: JSON Schema cannot say some of what the gateway refuses
(Python's idea of a printable message id, `1.0` given for an integer, the delay horizon of a
`deliver_at`), and a batch answers 200 with per-message errors for messages the schema calls
invalid, by design.

The dead-letter queues stay empty: nothing here dead-letters a message (no consumer runs, and
the test topology's bands have no max-length), so replay and purge find nothing to move. Their
answers are still accounted for (a replay moves messages between queues that are all counted; a
purge removes what it reports), and the end asserts that the DLQs are empty, so a run where that
premise fails says so instead of miscounting.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest
import schemathesis
from schemathesis import AuthContext, BaseSchema, Case, HookContext, Response
from schemathesis.engine import Status, events, from_schema

from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.openapi import ApiLimits, openapi_document
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology import naming
from bandgate.topology.model import Topology
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway

pytestmark = pytest.mark.integration

ADMIN = "admin-secret"
PUBLISHER = "publisher-secret"  # publish:orders
READER = "reader-secret"  # read:*
WRONG = "not-a-token"
# Who sends a request is decided by the request itself, so that a case Hypothesis replays
# while it shrinks is sent by the same caller. Admin half the time: it may call everything.
CALLERS = (ADMIN, ADMIN, ADMIN, PUBLISHER, READER, WRONG)

SEED = 20261123
MAX_EXAMPLES = 100  # per operation in the fuzzing phase; the coverage phase adds its own cases

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
    statuses: Counter[int] = field(default_factory=Counter)

    def record(self, case: Case[Any], response: Response) -> None:
        self.requests += 1
        self.statuses[response.status_code] += 1
        path = case.operation.path
        if response.status_code == 201:
            self.accepted += 1
        elif response.status_code == 200 and path.endswith("/messages/batch"):
            self.accepted += len(response.json()["successful"])
        elif response.status_code == 200 and case.method.upper() == "DELETE":
            self.purged += response.json()["purged"]


class Callers:
    """Bearer tokens for schemathesis: admin, publish:orders, read:* or an unknown one."""

    def get(self, case: Case[Any], ctx: AuthContext) -> str:
        body = case.body if isinstance(case.body, (dict, list, str, int, float, bool)) else None
        key = repr((case.method, case.formatted_path, sorted(case.query.items()), body))
        return CALLERS[zlib.crc32(key.encode()) % len(CALLERS)]

    def set(self, case: Case[Any], data: str, ctx: AuthContext) -> None:
        case.headers["Authorization"] = f"Bearer {data}"


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
            ),
        }
    )


@pytest.fixture
def live(secured_settings: GatewaySettings, topology: Topology) -> Iterator[LiveGateway]:
    with LiveGateway(secured_settings, topology) as gateway:
        yield gateway


def load(url: str, settings: GatewaySettings, topology: Topology) -> BaseSchema:
    """The document of this gateway's settings and topology, aimed at it."""
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
        }
    )
    document = openapi_document(ApiLimits.of(settings, topology))
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


async def settled_depths(amqp_url: str, topology: Topology, expected: int) -> dict[str, int]:
    """The queues' depths once they add up to `expected`, or after a few seconds: a delayed
    message between two levels of the ladder may be counted in neither for a moment."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        deadline = time.monotonic() + 5
        while True:
            depths = await queue_depths(connection, topology)
            if sum(depths.values()) == expected or time.monotonic() > deadline:
                return depths
            await asyncio.sleep(0.2)


def test_whole_document_never_5xx_and_only_accepted_messages_are_enqueued(
    live: LiveGateway, secured_settings: GatewaySettings, topology: Topology, amqp_url: str
) -> None:
    schema = load(live.url, secured_settings, topology)
    ledger = Ledger()

    @schema.hook
    def after_call(context: HookContext, case: Case[Any], response: Response) -> None:
        ledger.record(case, response)

    started = time.monotonic()
    problems = run(schema)
    expected = ledger.accepted - ledger.purged
    held = asyncio.run(settled_depths(amqp_url, topology, expected))
    print(
        f"schemathesis: {ledger.requests} requests in {time.monotonic() - started:.1f} s, "
        f"statuses {dict(sorted(ledger.statuses.items()))}, {ledger.accepted} accepted, "
        f"{ledger.purged} purged, {sum(held.values())} held"
    )
    assert not problems, "\n\n".join(problems)
    assert ledger.requests > 0
    dead = {name: held[name] for name in map(naming.dead_letter_queue, topology.queues)}
    assert not any(dead.values()), dead
    assert sum(held.values()) == expected, held

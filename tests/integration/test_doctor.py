"""`bandgate doctor` and `check_broker` against the test session's RabbitMQ (3.10 here)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import aio_pika
import pytest
from typer.testing import CliRunner

from bandgate.ops.ops_cli import app
from bandgate.topology.broker_report import BrokerReport
from bandgate.topology.declare import apply_topology, parse_version
from bandgate.topology.doctor import check_broker
from bandgate.topology.management import vhost_of
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.integration.test_dead_letters import write_topology

pytestmark = pytest.mark.integration


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "BANDGATE_MANAGEMENT_URL": None})


async def checked(amqp_url: str, topology: Topology, management_url: str | None) -> BrokerReport:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        return await check_broker(connection, topology, management_url, vhost_of(amqp_url))


async def applied(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)


def dlq_default_limit_warnings(version: tuple[int, ...], *queues: str) -> set[tuple[str, str]]:
    """RabbitMQ 4.0-4.2 give quorum queues a delivery limit of 20 and count every return, so
    each listing of a DLQ moves its dead letters a step towards being dropped: doctor warns
    for each DLQ. 3.x has no default limit, and 4.3 stopped counting nacks."""
    if (4, 0) <= version < (4, 3):
        return {("dlq_delivery_limit", f"{queue}.dlq") for queue in queues}
    return set()


def in_band_order(version: tuple[int, ...]) -> str:
    """What doctor says of a quorum band, per version (docs/guides/rabbitmq-versions.md, What
    order you get)."""
    if version < (4, 0):
        return "FIFO within band"
    return "two levels within band" if version < (4, 3) else "strict priority within band"


def test_doctor_reports_the_version_and_the_order_within_band(
    runner: CliRunner, broker: TestBroker, amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    asyncio.run(applied(amqp_url, topology))
    args = ["doctor", "--topology", str(write_topology(topology, tmp_path)), "--amqp-url", amqp_url]
    result = runner.invoke(app, [*args, "--management-url", broker.management_url])
    assert result.exit_code == 0, result.output
    report = asyncio.run(checked(amqp_url, topology, broker.management_url))
    assert result.stdout.startswith(f"RabbitMQ {report.version} on Erlang ")
    assert f"management API {report.version}" in result.stdout
    assert "guest" not in result.stdout
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if line.startswith("│")}
    version = parse_version(report.version)
    assert f"│ quorum  │ {in_band_order(version)} " in rows["orders.hot"]
    assert "│ classic │ exact priority within band " in rows["emails.cold"]
    assert "Across bands: waterfall" in result.stdout
    warnings = dlq_default_limit_warnings(version, "orders", "emails")
    assert f"0 error(s), {len(warnings)} warning(s)." in result.stdout

    assert report.ok
    assert {(f.code, f.subject) for f in report.findings} == warnings
    assert "publisher_confirms" in report.capabilities
    quorum = {item.rabbitmq_queue: item.ordering for item in report.ordering}
    assert quorum["orders.warm"] == in_band_order(version)

    without = runner.invoke(app, args)
    assert without.exit_code == 0, without.output
    assert "no management API" in without.stdout
    assert "INFO management API: no management URL" in without.stdout


def test_doctor_flags_a_conflicting_queue_and_a_delivery_limit_policy(
    runner: CliRunner, broker: TestBroker, amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    vhost = quote(vhost_of(amqp_url), safe="")
    with broker.management() as api:
        api.put(f"/api/queues/{vhost}/orders.hot", json={"durable": True}).raise_for_status()
        api.put(
            f"/api/policies/{vhost}/retry-cap",
            json={
                "pattern": r"^orders\.(warm|cold|dlq)$",
                "definition": {"delivery-limit": 2},
                "apply-to": "queues",
            },
        ).raise_for_status()

    report = asyncio.run(checked(amqp_url, topology, broker.management_url))
    assert not report.ok
    errors = {(f.code, f.subject) for f in report.errors}
    assert errors == {
        ("queue_conflict", "orders.hot"),
        ("delivery_limit", "orders.warm"),
        ("delivery_limit", "orders.cold"),
    }
    version = parse_version(report.version)
    # The policy's limit of 2 counts on a DLQ wherever nacks count (3.x, 4.0-4.2).
    dlq_warnings = dlq_default_limit_warnings(version, "emails")
    if version < (4, 3):
        dlq_warnings.add(("dlq_delivery_limit", "orders.dlq"))
    assert {(f.code, f.subject) for f in report.warnings} == dlq_warnings
    conflict = next(f for f in report.errors if f.code == "queue_conflict")
    assert "x-queue-type is 'classic' on the broker, the topology wants 'quorum'" in (
        conflict.message
    )

    args = ["doctor", "--topology", str(write_topology(topology, tmp_path)), "--amqp-url", amqp_url]
    result = runner.invoke(app, [*args, "--management-url", broker.management_url])
    assert result.exit_code == 1
    assert "ERROR orders.hot: queue 'orders.hot' exists with other settings" in result.stdout
    assert (
        "ERROR orders.warm: policy 'retry-cap' sets"
        not in result.stdout  # the message names the policy as the limit's source
    )
    assert "delivery-limit 2 (policy 'retry-cap') is below the queue's max_deliveries 5" in (
        result.stdout
    )
    assert f"3 error(s), {len(dlq_warnings)} warning(s)." in result.stdout
    assert "Traceback" not in result.output

    # Without the management API the conflict is found by declaring; policies are not read.
    probed = asyncio.run(checked(amqp_url, topology, None))
    assert {(f.code, f.subject) for f in probed.errors} == {("queue_conflict", "orders.hot")}
    assert "exists with other settings" in probed.errors[0].message
    assert {f.code for f in probed.findings} == {"queue_conflict", "queue_missing", "no_management"}


def test_what_the_management_user_may_not_read_is_a_warning(
    broker: TestBroker, amqp_url: str, topology: Topology
) -> None:
    vhost = quote(vhost_of(amqp_url), safe="")
    user = f"watcher-{vhost}"
    with broker.management() as api:
        api.put(
            f"/api/users/{user}", json={"password": "pw", "tags": "management"}
        ).raise_for_status()
        api.put(
            f"/api/permissions/{vhost}/{user}", json={"configure": "", "write": "", "read": ".*"}
        ).raise_for_status()
    try:
        asyncio.run(applied(amqp_url, topology))
        host = broker.management_url.rsplit("@", 1)[1]
        report = asyncio.run(checked(amqp_url, topology, f"http://{user}:pw@{host}"))
        refused = asyncio.run(checked(amqp_url, topology, f"http://{user}:wrong@{host}"))
    finally:
        with broker.management() as api:
            api.delete(f"/api/users/{user}")
    # A `management` user reads queues and policies everywhere, and the node's feature flags
    # on 4.x (on 3.x they need the `administrator` tag).
    assert report.ok
    version = parse_version(report.version)
    found = {(f.code, f.subject) for f in report.findings}
    assert found - {("management_forbidden", "management API")} == dlq_default_limit_warnings(
        version, "orders", "emails"
    )
    forbidden = [f for f in report.findings if f.code == "management_forbidden"]
    if version < (4, 0):
        [finding] = forbidden
        assert finding.severity == "warning"
        assert finding.message == "this user may not read feature-flags: not checked"
    else:
        assert forbidden == []

    # A login the management API refuses: queues are still checked, by declaring them.
    assert refused.ok
    [unavailable] = refused.findings
    assert unavailable.code == "management_unavailable"
    assert "HTTP 401 from /api/overview" in unavailable.message
    assert "wrong" not in unavailable.message

"""The broker check's rules: in-band order by version, how policies apply, and what they break."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bandgate.topology.broker_report import BandOrdering, BrokerCheckError, BrokerReport, Finding
from bandgate.topology.conflicts import exchange_conflicts, queue_conflicts
from bandgate.topology.doctor import band_ordering, log_report
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Band, Topology
from bandgate.topology.objects import plan
from bandgate.topology.policy_checks import Policy, effective_policy, policy_findings


@pytest.fixture
def topology() -> Topology:
    return parse_topology(
        {
            "delay": {"levels": 3},
            "queues": {
                "orders": {
                    "bands": [
                        {"name": "hot", "priorities": [7, 9]},
                        {"name": "warm", "priorities": [4, 6], "age_after_seconds": 60},
                        {"name": "cold", "priorities": [0, 3], "type": "classic"},
                    ],
                    "retry": {"max_attempts": 8, "max_deliveries": 5},
                }
            },
        }
    )


def policy(
    pattern: str, definition: dict[str, Any], priority: int = 0, apply_to: str = "queues"
) -> Policy:
    return Policy(f"p-{pattern}-{priority}", pattern, apply_to, priority, definition)


def by_subject(findings: list[Finding]) -> dict[str, list[Finding]]:
    grouped: dict[str, list[Finding]] = {}
    for finding in findings:
        grouped.setdefault(finding.subject, []).append(finding)
    return grouped


@pytest.mark.parametrize(
    ("version", "label"),
    [
        ((3, 10, 8), "FIFO within band"),
        ((3, 13, 7), "FIFO within band"),
        ((), "FIFO within band"),
        ((4, 0, 5), "two levels within band"),
        ((4, 2, 1), "two levels within band"),
        ((4, 3, 0), "strict priority within band"),
    ],
)
def test_quorum_order_depends_on_the_version(version: tuple[int, ...], label: str) -> None:
    assert band_ordering(version, Band(name="hot", priorities=(7, 9)))[0] == label


def test_a_classic_band_is_exact_on_any_version() -> None:
    band = Band(name="cold", priorities=(0, 3), type="classic")
    for version in ((3, 10, 8), (4, 1, 0)):
        label, detail = band_ordering(version, band)
        assert label == "exact priority within band"
        assert "x-max-priority 3" in detail


def test_the_highest_priority_policy_applies_and_operator_limits_take_the_lower() -> None:
    policies = [
        policy(r"^orders\.", {"message-ttl": 1000, "max-length": 10}, 1),
        policy(r"^orders\.hot$", {"delivery-limit": 50}, 5),
        policy(r"^orders\.", {"delivery-limit": 1}, 9, apply_to="exchanges"),
        policy(r"^orders\.", {"delivery-limit": 1}, 9, apply_to="classic_queues"),
    ]
    operator = [policy(".*", {"delivery-limit": 30, "expires": 5}, 0)]
    names, definition = effective_policy("orders.hot", "quorum", policies, operator)
    assert names == "p-^orders\\.hot$-5 + p-.*-0"
    assert definition == {"delivery-limit": 30, "expires": 5}
    assert effective_policy("orders.cold", "classic", policies)[1] == {"delivery-limit": 1}
    assert effective_policy("emails.hot", "quorum", policies) == (None, {})
    assert effective_policy("x", "quorum", [policy("([", {"expires": 1}, 1)]) == (None, {})


def test_no_policies_on_3x_means_no_findings(topology: Topology) -> None:
    assert policy_findings(topology, (3, 10, 8), []) == []


def test_4x_default_delivery_limit_is_fine_with_default_retries(topology: Topology) -> None:
    findings = policy_findings(topology, (4, 1, 0), [])
    assert [(f.code, f.subject, f.severity) for f in findings] == [
        ("dlq_delivery_limit", "orders.dlq", "warning")
    ]
    assert "listed 20 times is dropped" in findings[0].message
    assert "delivery-limit -1" in findings[0].message
    assert policy_findings(topology, (4, 3, 0), []) == []  # 4.3 does not count nack returns


def test_a_delivery_limit_below_max_deliveries_is_an_error(topology: Topology) -> None:
    findings = by_subject(
        policy_findings(topology, (3, 10, 8), [policy(r"^orders\.", {"delivery-limit": 2})])
    )
    hot, warm = findings["orders.hot"][0], findings["orders.warm"][0]
    assert (hot.severity, hot.code) == ("error", "delivery_limit")
    assert "below the queue's max_deliveries 5" in hot.message
    assert "to orders.dlq without bandgate's failure headers" in hot.message
    assert "into band 'hot'" in warm.message  # warm dead-letters into hot by aging: a loop
    assert "orders.cold" not in findings  # a classic queue has no delivery limit
    assert findings["orders.dlq"][0].code == "dlq_delivery_limit"
    assert "remove the policy's delivery-limit" in findings["orders.dlq"][0].message


def test_4x_default_below_max_deliveries_is_an_error(topology: Topology) -> None:
    greedy = parse_topology(
        {"delay": {"levels": 1}, "queues": {"jobs": {"retry": {"max_deliveries": 25}}}}
    )
    errors = [f for f in policy_findings(greedy, (4, 0, 2), []) if f.severity == "error"]
    assert {f.subject for f in errors} == {"jobs.hot", "jobs.warm", "jobs.cold"}
    assert "RabbitMQ 4.x's default" in errors[0].message
    unlimited = [policy(".*", {"delivery-limit": -1})]
    assert policy_findings(greedy, (4, 0, 2), unlimited) == []


def test_a_delivery_limit_only_below_max_attempts_is_a_warning(topology: Topology) -> None:
    findings = policy_findings(
        topology, (4, 1, 0), [policy(r"^orders\.(hot|warm)$", {"delivery-limit": 6})]
    )
    assert {(f.subject, f.severity) for f in findings} >= {
        ("orders.hot", "warning"),
        ("orders.warm", "warning"),
    }
    assert "below max_attempts 8" in findings[0].message


def test_message_ttl_policies_that_override_the_topology(topology: Topology) -> None:
    findings = by_subject(
        policy_findings(topology, (3, 10, 8), [policy(".*", {"message-ttl": 5000})])
    )
    assert "dead-lettered to orders.dlq without being handled" in findings["orders.hot"][0].message
    assert "promoted to hot early" in findings["orders.warm"][0].message
    assert "dead letters expire and are dropped" in findings["orders.dlq"][0].message
    # Level 0 holds 50 ms, level 2 200 ms: a 5 s policy is the higher, the level's own applies.
    assert "zz.bandgate.delay.00" not in findings
    assert all(f.severity == "error" for group in findings.values() for f in group)
    short = by_subject(
        policy_findings(topology, (3, 10, 8), [policy("delay", {"message-ttl": 100})])
    )
    assert "delays through this level end after 100 ms instead of 200 ms" in (
        short["zz.bandgate.delay.02"][0].message
    )
    assert "zz.bandgate.delay.00" not in short


def test_expires_length_and_ignored_dead_letter_policies(topology: Topology) -> None:
    findings = by_subject(
        policy_findings(
            topology,
            (3, 10, 8),
            [policy(".*", {"expires": 60000, "max-length": 100, "dead-letter-exchange": "x"})],
        )
    )
    codes = {(f.code, f.severity) for f in findings["orders.dlq"]}
    assert codes == {("policy_expires", "error"), ("policy_max_length", "error")}
    hot = {(f.code, f.severity) for f in findings["orders.hot"]}
    assert hot == {
        ("policy_expires", "error"),
        ("policy_max_length", "warning"),
        ("policy_ignored", "info"),
    }


def test_queue_conflicts_name_every_difference(topology: Topology) -> None:
    existing: dict[str, dict[str, Any]] = {
        decl.name: {"arguments": dict(decl.arguments), "type": decl.arguments["x-queue-type"]}
        for decl in plan(topology).queues
        if decl.name != "zz.bandgate.delay.01"
    }
    assert [f.code for f in queue_conflicts(topology, existing)] == ["queue_missing"]
    existing["orders.hot"] = {"arguments": {}, "type": "classic"}
    findings = queue_conflicts(topology, existing)
    conflict = next(f for f in findings if f.code == "queue_conflict")
    assert conflict.subject == "orders.hot"
    assert (
        "x-queue-type is 'classic' on the broker, the topology wants 'quorum'" in conflict.message
    )
    missing = next(f for f in findings if f.code == "queue_missing")
    assert "1 queue(s) not declared yet (zz.bandgate.delay.01)" in missing.message


def test_exchange_conflicts(topology: Topology) -> None:
    assert exchange_conflicts(topology, {"bandgate": "topic", "bandgate.dead": "direct"}) == []
    [finding] = exchange_conflicts(topology, {"bandgate.dead": "fanout"})
    assert finding.subject == "bandgate.dead"
    assert "type 'fanout', the topology wants 'direct'" in finding.message


def report(*findings: Finding) -> BrokerReport:
    ordering = BandOrdering("orders", "hot", "orders.hot", "quorum", "FIFO within band", "why")
    return BrokerReport(
        "3.10.8", "RabbitMQ", "rabbit@x", "25.2", "3.10.8", (), (ordering,), findings
    )


def test_a_report_raises_only_for_errors(caplog: pytest.LogCaptureFixture) -> None:
    warning = Finding("warning", "w", "orders.dlq", "careful")
    report(warning).raise_for_errors()
    failing = report(warning, Finding("error", "e", "orders.hot", "conflicts"))
    assert not failing.ok
    with pytest.raises(BrokerCheckError, match="orders.hot: conflicts"):
        failing.raise_for_errors()
    assert failing.summary() == (
        "RabbitMQ 3.10.8 on Erlang 25.2, cluster 'rabbit@x', management API 3.10.8"
    )
    assert failing.to_json()["ordering"][0]["ordering"] == "FIFO within band"
    with caplog.at_level(logging.INFO, logger="bandgate.topology.doctor"):
        log_report(failing)
    assert "in-band order of orders.hot: FIFO within band (why)" in caplog.text
    levels = {record.getMessage(): record.levelname for record in caplog.records}
    assert levels["broker check: orders.hot: conflicts"] == "ERROR"
    assert levels["broker check: orders.dlq: careful"] == "WARNING"

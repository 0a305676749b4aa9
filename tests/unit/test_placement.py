"""`bandgate doctor`'s view of leader placement, from a management API's queue list."""

from __future__ import annotations

from collections import Counter
from typing import Any

from bandgate.topology.conflicts import queue_conflicts
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.objects import plan, replicated_queues
from bandgate.topology.placement import fair_share, placement_findings

NODES = ["rabbit@a", "rabbit@b", "rabbit@c"]
TOPOLOGY: Topology = parse_topology(
    {
        "delay": {"levels": 3},
        "queues": {
            "orders": {
                "bands": [
                    {"name": "hot", "priorities": [5, 9]},
                    {"name": "cold", "priorities": [0, 4], "shards": 3},
                ]
            }
        },
    }
)


def listing(leader_of: dict[str, str], members: int = 3) -> list[dict[str, Any]]:
    """The management API's queues: quorum queues name a `leader`, a stream its `node`."""
    queues = []
    for decl in plan(TOPOLOGY).queues:
        item: dict[str, Any] = {"name": decl.name, "arguments": dict(decl.arguments)}
        leader = leader_of.get(decl.name)
        if leader is not None:
            kind = decl.arguments["x-queue-type"]
            item["type"] = kind
            item["leader" if kind == "quorum" else "node"] = leader
            item["members"] = NODES[:members]
        queues.append(item)
    return queues


def spread() -> dict[str, str]:
    return {name: NODES[i % 3] for i, name in enumerate(replicated_queues(TOPOLOGY))}


def codes(findings: list[Any]) -> dict[str, str]:
    return {finding.code: finding.message for finding in findings}


def test_spread_leaders_are_reported_per_node_and_nothing_else() -> None:
    found = codes(placement_findings(TOPOLOGY, listing(spread()), NODES))
    total = len(replicated_queues(TOPOLOGY))
    assert set(found) == {"leaders"}
    assert found["leaders"].startswith(f"leaders of {total} replicated queues per node: rabbit@a")


def test_every_leader_on_one_node_is_skewed_and_the_shards_share_it() -> None:
    on_a = {name: "rabbit@a" for name in replicated_queues(TOPOLOGY)}
    found = codes(placement_findings(TOPOLOGY, listing(on_a), NODES))
    assert "rebalance all" in found["leader_skew"]
    assert "its 3 shards are led by 1 node(s)" in found["shard_leaders_shared"]


def test_the_fair_share_allows_one_more_than_an_even_split() -> None:
    assert fair_share(33, 3) == 12
    assert fair_share(34, 3) == 13
    total = len(replicated_queues(TOPOLOGY))
    leaders = spread()
    moved = [name for name, node in leaders.items() if node != "rabbit@a"]
    for name in moved[: fair_share(total, 3) - total // 3]:
        leaders[name] = "rabbit@a"
    assert Counter(leaders.values())["rabbit@a"] == fair_share(total, 3)
    assert "leader_skew" not in codes(placement_findings(TOPOLOGY, listing(leaders), NODES))
    leaders[moved[-1]] = "rabbit@a"
    assert "leader_skew" in codes(placement_findings(TOPOLOGY, listing(leaders), NODES))


def test_queues_with_fewer_members_than_nodes_are_named() -> None:
    found = codes(placement_findings(TOPOLOGY, listing(spread(), members=1), NODES))
    assert "have fewer than 3 members" in found["queue_under_replicated"]


def test_a_single_node_has_no_placement_to_report() -> None:
    assert placement_findings(TOPOLOGY, listing(spread()), ["rabbit@a"]) == []


def test_queues_declared_before_placement_are_noted_not_conflicts() -> None:
    older = {
        decl.name: {"arguments": dict(decl.without_placement().arguments)}
        for decl in plan(TOPOLOGY).queues
    }
    found = codes(queue_conflicts(TOPOLOGY, older))
    assert set(found) == {"leaders_not_placed"}
    # ...while a real difference is still an error.
    older["orders.hot"]["arguments"]["x-max-length"] = 5
    assert "queue_conflict" in codes(queue_conflicts(TOPOLOGY, older))

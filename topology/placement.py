"""Where the leaders of bandgate's replicated queues sit in a cluster, and what is wrong there.

A quorum queue's or stream's leader does all of its work: every write's consensus round, every
delivery. RabbitMQ places a new leader on the node the declaring client is connected to unless
told otherwise, so a topology applied through one node put all 33 leaders on it (3.10.8,
three nodes): one node worked while two followed, and a sharded band's shards bought nothing.
bandgate declares them with `x-queue-leader-locator: balanced` (`topology.objects`), and this
module reads the result for `bandgate doctor`. Pure: it takes the management API's queue list.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from bandgate.topology.broker_report import Finding, listed
from bandgate.topology.model import Topology
from bandgate.topology.objects import replicated_queues

# The members a replicated queue wants: RabbitMQ's default target for quorum queues and the
# usual size of a cluster; on fewer nodes, all of them.
TARGET_MEMBERS = 3
REBALANCE = (
    "`rabbitmq-queues rebalance all` (run on any node) moves leaders without losing a message"
)


def fair_share(queues: int, nodes: int) -> int:
    """The most leaders one node should hold: an even share, and one more."""
    return math.ceil(queues / nodes) + 1


def placement_findings(
    topology: Topology, queues: Iterable[Mapping[str, Any]], nodes: Iterable[str]
) -> list[Finding]:
    """Leaders per node, skew, shards of one band led by one node, missing members."""
    running = sorted(set(nodes))
    if len(running) < 2:
        return []
    by_name = {str(queue.get("name")): queue for queue in queues}
    leaders = {
        name: leader
        for name in replicated_queues(topology)
        if name in by_name and (leader := _leader(by_name[name]))
    }
    if not leaders:
        return []
    findings = [_per_node(leaders, running)]
    findings += _skew(leaders, running)
    findings += _shards(topology, leaders, len(running))
    findings += _members(by_name, leaders, running)
    return findings


def _leader(queue: Mapping[str, Any]) -> str:
    """A quorum queue's `leader`; a stream's leader is its `node` in the management API."""
    return str(queue.get("leader") or queue.get("node") or "")


def _per_node(leaders: Mapping[str, str], nodes: list[str]) -> Finding:
    counts = Counter(leaders.values())
    shown = ", ".join(f"{node} {counts.get(node, 0)}" for node in nodes)
    return Finding.info(
        "leaders", "cluster", f"leaders of {len(leaders)} replicated queues per node: {shown}"
    )


def _skew(leaders: Mapping[str, str], nodes: list[str]) -> list[Finding]:
    counts = Counter(leaders.values())
    most, held = counts.most_common(1)[0]
    limit = fair_share(len(leaders), len(nodes))
    if held <= limit:
        return []
    return [
        Finding.warning(
            "leader_skew",
            "cluster",
            f"{most} leads {held} of {len(leaders)} replicated queues (an even share is at most "
            f"{limit}): that node does their work while the others follow. {REBALANCE}",
        )
    ]


def _shards(topology: Topology, leaders: Mapping[str, str], nodes: int) -> list[Finding]:
    findings = []
    for spec in topology.queues.values():
        for band in spec.bands:
            if band.shards < 2:
                continue
            shards = spec.band_queues(band)
            on = {leaders[name] for name in shards if name in leaders}
            if len(on) < min(len(shards), nodes):
                findings.append(
                    Finding.warning(
                        "shard_leaders_shared",
                        f"{spec.name}.{band.name}",
                        f"its {len(shards)} shards are led by {len(on)} node(s) "
                        f"({', '.join(sorted(on))}): the shards share those nodes' work. "
                        + REBALANCE,
                    )
                )
    return findings


def _members(
    by_name: Mapping[str, Mapping[str, Any]], leaders: Mapping[str, str], nodes: list[str]
) -> list[Finding]:
    target = min(len(nodes), TARGET_MEMBERS)
    short = sorted(
        name
        for name in leaders
        if isinstance(by_name[name].get("members"), list) and len(by_name[name]["members"]) < target
    )
    if not short:
        return []
    return [
        Finding.warning(
            "queue_under_replicated",
            "cluster",
            f"{len(short)} replicated queue(s) have fewer than {target} members ({listed(short)}): "
            "they survive fewer node losses; `rabbitmq-queues grow <node> all` adds members",
        )
    ]


__all__ = ["TARGET_MEMBERS", "fair_share", "placement_findings"]

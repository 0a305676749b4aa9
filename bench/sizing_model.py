"""The sizing model of docs/deploy/sizing.md: how many nodes, shards, gateway and worker cores
a load needs, from per-message costs measured by our benchmarks and planning assumptions
stated below. `python -m bench.sizing_model` prints the doc's tables; a unit test checks that
the doc holds exactly what it prints, so the two cannot drift.

Every measured figure names the command that produced it. Costs are CPU time of this
machine's cores (x86_64, two shared cores); a faster core divides them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class BrokerCosts:
    """Per message of one body size, on a three-member quorum queue (`python -m bench cluster`):
    µs of CPU over the whole cluster, the leader's Ra process, and the WAL writer of each node
    (publish + deliver and ack), and bytes each member writes (WAL at publish and ack, then the
    segment file the WAL is flushed into, one more copy of the body)."""

    body: int
    publish_us: float
    consume_us: float
    hop_us: float  # one delay level passed: `delayed - publish`
    ra_leader_us: float
    wal_us: float
    written_per_member: float


@dataclass(frozen=True)
class Assumptions:
    """Planning choices, not measurements: change them to your hardware."""

    node_cores: int = 16
    utilisation: float = 0.6  # of a node's CPU, so that losing one of 3 nodes stays under 90 %
    queue_headroom: float = 0.5  # of one queue's (one Erlang process's) ceiling
    wal_headroom: float = 0.6  # of one node's WAL writer (one Erlang process)
    disk_bytes_per_s: float = 1.0e9  # sustained writes one node's data disk takes (NVMe)
    nic_bits_per_s: float = 25e9
    nic_utilisation: float = 0.5
    largest_cluster: int = 7  # nodes; larger loads take several clusters, queues split among them


# `python -m bench cluster [--rabbitmq 4.3]`: medians of three rounds, publish and consume at
# 512 in flight (the deeper pipeline, nearer a loaded node's batches), a hop at 64.
MEASURED = {
    "4.3.6": {  # 2026-11-26 11:23 UTC
        1 * KIB: BrokerCosts(
            KIB, 229, 480, 559 - 268, 45.8 + 119, 23.2 + 9.4, (2.15 + 1.12 + 1) * KIB
        ),
        10 * KIB: BrokerCosts(
            10 * KIB, 334, 652, 768 - 412, 30.0 + 129, 65.3 + 10.3, (13.63 + 1.66 + 10) * KIB
        ),
    },
    "3.10.8": {  # 2026-11-26 11:29 UTC
        1 * KIB: BrokerCosts(
            KIB, 274, 487, 893 - 337, 59.1 + 143, 28.5 + 15.9, (2.37 + 1.14 + 1) * KIB
        ),
        10 * KIB: BrokerCosts(
            10 * KIB, 380, 550, 1222 - 578, 24.5 + 153, 57.5 + 17.5, (20.32 + 1.34 + 10) * KIB
        ),
    },
}
# `python -m bench publish` (gateway µs of CPU per message, its median run; 3.10.8, 2026-11-26
# 11:32 UTC) and `python -m bench consume` (the worker's, no-op handler; 3.10.8, 2026-11-23).
GATEWAY_SINGLE_US = 228.0
GATEWAY_BATCH_US = 54.0
WORKER_US = 103.0


@dataclass(frozen=True)
class Plan:
    rate: int
    body: int
    nodes_cpu: int
    nodes_wal: int
    nodes_disk: int
    nodes_network: int
    shards: int  # per band, if one band carries the whole rate
    gateway_cores_single: float
    gateway_cores_batch: float
    worker_cores: float

    @property
    def nodes(self) -> int:
        return max(3, self.nodes_cpu, self.nodes_wal, self.nodes_disk, self.nodes_network)

    @property
    def limit(self) -> str:
        by = {
            "broker CPU": self.nodes_cpu,
            "WAL writer": self.nodes_wal,
            "disk": self.nodes_disk,
            "network": self.nodes_network,
        }
        name, needed = max(by.items(), key=lambda item: item[1])
        return name if needed > 3 else "none (3 nodes for three replicas)"

    def clusters(self, assumptions: Assumptions) -> int:
        return math.ceil(self.nodes / assumptions.largest_cluster)


def network_bytes_per_node(rate: float, body: int, nodes: int) -> float:
    """Bytes a node sends per second (and receives, as much): a publisher's node forwards the
    body to the leader, the leader replicates it to two followers and hands each delivery to the
    consumer's node, and the clients send and take it once; clients and leaders spread evenly.
    Each byte between nodes leaves one node and enters another."""
    elsewhere = (nodes - 1) / nodes  # the chance that a client sits on another node
    between_nodes = rate * body * (2 + 2 * elsewhere)
    return (between_nodes + rate * body) / nodes


def plan(rate: int, costs: BrokerCosts, assumptions: Assumptions) -> Plan:
    a = assumptions
    cluster_cores = rate * (costs.publish_us + costs.consume_us) / 1e6
    member_writes = 3 * rate  # every message goes through three members' WALs
    wal_per_node = a.wal_headroom * 1e6 / costs.wal_us
    queue_ceiling = 1e6 / costs.ra_leader_us
    nodes_network = 3
    while network_bytes_per_node(rate, costs.body, nodes_network) * 8 > (
        a.nic_bits_per_s * a.nic_utilisation
    ):
        nodes_network += 1
    return Plan(
        rate=rate,
        body=costs.body,
        nodes_cpu=math.ceil(cluster_cores / (a.node_cores * a.utilisation)),
        nodes_wal=math.ceil(member_writes / wal_per_node),
        nodes_disk=math.ceil(member_writes * costs.written_per_member / a.disk_bytes_per_s),
        nodes_network=nodes_network,
        shards=math.ceil(rate / (queue_ceiling * a.queue_headroom)),
        gateway_cores_single=rate * GATEWAY_SINGLE_US / 1e6,
        gateway_cores_batch=rate * GATEWAY_BATCH_US / 1e6,
        worker_cores=rate * WORKER_US / 1e6,
    )


def cost_table(costs: dict[int, BrokerCosts]) -> str:
    lines = [
        "| body | publish | deliver + ack | a delay hop | one queue's leader | one node's WAL "
        "| written per member |",
        "|---|---|---|---|---|---|---|",
    ]
    for body, c in costs.items():
        lines.append(
            f"| {body // KIB} KiB | {c.publish_us:.0f} µs | {c.consume_us:.0f} µs "
            f"| {c.hop_us:.0f} µs | {c.ra_leader_us:.0f} µs (≤ {1e6 / c.ra_leader_us:,.0f}/s) "
            f"| {c.wal_us:.0f} µs (≤ {1e6 / c.wal_us:,.0f}/s) "
            f"| {c.written_per_member / KIB:.1f} KiB |"
        )
    return "\n".join(lines)


def plan_table(costs: dict[int, BrokerCosts], assumptions: Assumptions) -> str:
    lines = [
        "| load | nodes (CPU / WAL / disk / network) | what stops it | clusters "
        "| shards per band | gateway cores (1 msg / batch of 100) "
        "| worker cores, bandgate's share |",
        "|---|---|---|---|---|---|---|",
    ]
    for rate in (10_000, 100_000, 1_000_000):
        for body, c in costs.items():
            p = plan(rate, c, assumptions)
            lines.append(
                f"| {rate:,}/s × {body // KIB} KiB "
                f"| **{p.nodes}** ({p.nodes_cpu} / {p.nodes_wal} / {p.nodes_disk} "
                f"/ {p.nodes_network}) | {p.limit} | {p.clusters(assumptions)} "
                f"| {p.shards} | {p.gateway_cores_single:,.1f} / {p.gateway_cores_batch:,.1f} "
                f"| {p.worker_cores:,.1f} |"
            )
    return "\n".join(lines)


def costs_section() -> str:
    """The doc's block between `<!-- sizing-model:costs -->` and its end marker."""
    return "\n\n".join(
        f"RabbitMQ {version}, per message:\n\n{cost_table(costs)}"
        for version, costs in MEASURED.items()
    )


def plans_section(assumptions: Assumptions | None = None) -> str:
    """The doc's block between `<!-- sizing-model:plans -->` and its end marker."""
    return "\n\n".join(
        f"RabbitMQ {version}, the plan:\n\n{plan_table(costs, assumptions or Assumptions())}"
        for version, costs in MEASURED.items()
    )


def main() -> None:
    print(costs_section(), end="\n\n")
    print(plans_section())


if __name__ == "__main__":
    main()

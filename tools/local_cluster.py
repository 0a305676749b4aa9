"""A local RabbitMQ cluster of private nodes on this machine, for the fault tests and the
cluster benchmark."""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bandgate.ops.local_broker import NO_BUSY_WAIT, LocalBroker, configured_root


@dataclass
class LocalCluster:
    base_dir: Path
    size: int = 3
    plugins: tuple[str, ...] = ()  # rabbitmq_management on every node, for the doctor's view
    # A Debian root of tools.broker_roots (None: the installed RabbitMQ).
    root: Path | None = field(default_factory=configured_root)
    erl_args: str = NO_BUSY_WAIT  # Erlang VM flags for every node (`LocalBroker.erl_args`)
    nodes: list[LocalBroker] = field(default_factory=list)

    def start(self) -> LocalCluster:
        cookie = secrets.token_hex(16).upper()
        prefix = f"bandgate-c{secrets.token_hex(2)}"
        for index in range(self.size):
            directory = self.base_dir / f"node{index}"
            directory.mkdir(parents=True, exist_ok=True)
            cookie_file = directory / ".erlang.cookie"
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)
            self.nodes.append(
                LocalBroker(
                    directory,
                    name=f"{prefix}-{index}",
                    plugins=self.plugins,
                    root=self.root,
                    erl_args=self.erl_args,
                )
            )
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(lambda node: node.start(), self.nodes))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.ctl("stop_app")
            node.ctl("reset")
            node.ctl("join_cluster", first.node)
            node.ctl("start_app")
        return self

    def by_name(self, node_name: str) -> LocalBroker:
        return next(node for node in self.nodes if node.node == node_name)

    def leader_of(self, queue: str, asking: LocalBroker | None = None) -> str:
        """Node name leading a quorum queue (vhost /)."""
        leaders = self.leaders(asking=asking)
        if queue not in leaders:
            raise LookupError(f"queue {queue} not found")
        return leaders[queue]

    def leaders(self, vhost: str = "/", asking: LocalBroker | None = None) -> dict[str, str]:
        """Each replicated queue of `vhost` and the node leading it."""
        node = asking or self.nodes[0]
        output = node.ctl(
            "list_queues", "-p", vhost, "name", "leader", "--quiet", "--no-table-headers"
        )
        found = {}
        for line in output.splitlines():
            name, _, leader = line.partition("\t")
            if leader.strip():
                found[name] = leader.strip()
        return found

    def stop(self) -> None:
        with ThreadPoolExecutor(self.size) as pool:
            list(pool.map(lambda node: node.stop(), self.nodes))

"""A private node's configuration files (`ops.local_broker`), written without starting it."""

from __future__ import annotations

import re
from pathlib import Path

from bandgate.ops.local_broker import QUORUM_WAL_MAX_SIZE_BYTES, LocalBroker, quorum_wal_setting


def test_extra_settings_and_an_advanced_term_reach_the_node(tmp_path: Path) -> None:
    node = LocalBroker(
        tmp_path,
        settings=("quorum_queue.compute_checksums = false",),
        advanced="[{ra, [{wal_sync_method, none}]}].",
        root=None,
    )
    node._write_config()
    conf = (tmp_path / "rabbitmq.conf").read_text().splitlines()
    assert conf[0] == f"listeners.tcp.default = 127.0.0.1:{node.amqp_port}"
    assert conf[-1] == "quorum_queue.compute_checksums = false"
    assert (tmp_path / "advanced.config").read_text() == "[{ra, [{wal_sync_method, none}]}].\n"
    assert node._env()["RABBITMQ_ADVANCED_CONFIG_FILE"] == str(tmp_path / "advanced.config")


def test_without_an_advanced_term_the_node_reads_no_advanced_file(tmp_path: Path) -> None:
    node = LocalBroker(tmp_path, root=None)
    node._write_config()
    assert not (tmp_path / "advanced.config").exists()
    assert "RABBITMQ_ADVANCED_CONFIG_FILE" not in node._env()


def _root_with_schema(root: Path, schema: str) -> Path:
    directory = root / "usr/lib/rabbitmq/lib/rabbitmq_server-9.9.9/plugins/rabbit-9.9.9/priv"
    (directory / "schema").mkdir(parents=True)
    (directory / "schema" / "rabbit.schema").write_text(schema)
    return root


def test_a_node_before_43_sizes_its_quorum_wal_with_the_raft_key(tmp_path: Path) -> None:
    root = _root_with_schema(tmp_path / "root", '{mapping, "raft.wal_max_size_bytes", ...}.')
    assert quorum_wal_setting(root, 1024) == "raft.wal_max_size_bytes = 1024"


def test_a_node_from_43_sizes_its_quorum_wal_with_the_quorum_queue_key(tmp_path: Path) -> None:
    root = _root_with_schema(
        tmp_path / "root",
        '{mapping, "raft.wal_max_size_bytes", ...}.\n'
        '{mapping, "quorum_queue.wal_max_size_bytes", "rabbit.quorum_wal_max_size_bytes", []}.',
    )
    assert quorum_wal_setting(root, 1024) == "quorum_queue.wal_max_size_bytes = 1024"


def test_the_wal_line_is_written_unless_the_node_keeps_rabbitmqs_default(tmp_path: Path) -> None:
    root = _root_with_schema(tmp_path / "root", "")
    sized = LocalBroker(tmp_path / "sized", root=root)
    sized._write_config()
    conf = (tmp_path / "sized" / "rabbitmq.conf").read_text().splitlines()
    assert f"raft.wal_max_size_bytes = {QUORUM_WAL_MAX_SIZE_BYTES}" in conf
    default = LocalBroker(tmp_path / "default", root=root, quorum_wal_max_size_bytes=None)
    default._write_config()
    assert "wal_max_size_bytes" not in (tmp_path / "default" / "rabbitmq.conf").read_text()


def test_the_compose_broker_sizes_its_wal_as_private_nodes_do() -> None:
    """rabbitmq/rabbitmq.conf is written by hand for the compose file's image: a RabbitMQ before
    4.3, whose quorum queues take the `raft.` key."""
    repo = Path(__file__).resolve().parents[2]
    image = re.search(r"image: rabbitmq:(\d+)\.(\d+)", (repo / "docker-compose.yml").read_text())
    assert image is not None
    assert (int(image[1]), int(image[2])) < (4, 3)
    conf = (repo / "rabbitmq" / "rabbitmq.conf").read_text().splitlines()
    assert f"raft.wal_max_size_bytes = {QUORUM_WAL_MAX_SIZE_BYTES}" in conf

"""A private node's configuration files (`ops.local_broker`), written without starting it."""

from __future__ import annotations

from pathlib import Path

from bandgate.ops.local_broker import LocalBroker


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

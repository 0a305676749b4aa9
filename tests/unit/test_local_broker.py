"""A private node's configuration files (`ops.local_broker`), written without starting it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bandgate.ops.local_broker import (
    QUORUM_WAL_MAX_SIZE_BYTES,
    LocalBroker,
    quorum_wal_key,
    quorum_wal_setting,
)


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


def _root_of(root: Path, version: str) -> Path:
    (root / "usr/lib/rabbitmq/lib" / f"rabbitmq_server-{version}").mkdir(parents=True)
    return root


@pytest.mark.parametrize(
    ("version", "key"),
    [
        ("3.10.8", "raft.wal_max_size_bytes"),
        ("4.0.5", "raft.wal_max_size_bytes"),
        ("4.2", "raft.wal_max_size_bytes"),
        ("4.3.6", "quorum_queue.wal_max_size_bytes"),
        ("4.3", "quorum_queue.wal_max_size_bytes"),
        ("5.0.0", "quorum_queue.wal_max_size_bytes"),
    ],
)
def test_the_wal_key_follows_the_version(tmp_path: Path, version: str, key: str) -> None:
    assert quorum_wal_key(version) == key
    assert quorum_wal_setting(_root_of(tmp_path, version), 1024) == f"{key} = 1024"


def test_the_wal_line_is_written_unless_the_node_keeps_rabbitmqs_default(tmp_path: Path) -> None:
    root = _root_of(tmp_path / "root", "3.10.8")
    sized = LocalBroker(tmp_path / "sized", root=root)
    sized._write_config()
    conf = (tmp_path / "sized" / "rabbitmq.conf").read_text().splitlines()
    assert f"raft.wal_max_size_bytes = {QUORUM_WAL_MAX_SIZE_BYTES}" in conf
    default = LocalBroker(tmp_path / "default", root=root, quorum_wal_max_size_bytes=None)
    default._write_config()
    assert "wal_max_size_bytes" not in (tmp_path / "default" / "rabbitmq.conf").read_text()


def test_a_private_node_runs_without_busy_waiting_unless_asked(tmp_path: Path) -> None:
    """It shares the machine's cores with the gateway, workers and tests (ops/local_broker.py)."""
    quiet = LocalBroker(tmp_path / "quiet", root=None)._env()
    assert quiet["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] == "+sbwt none +sbwtdcpu none +sbwtdio none"
    spinning = LocalBroker(tmp_path / "spinning", root=None, erl_args="")._env()
    assert "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS" not in spinning

"""The sync producer's start-up, without a broker: a failure to connect is raised in the
caller's thread, typed, and leaves no thread behind."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bandgate.core.publish_outcomes import BrokerUnavailable
from bandgate.core.sync_producer import SyncProducer
from bandgate.ops.local_broker import free_port
from bandgate.topology.loader import TopologyError, parse_topology

TOPOLOGY = parse_topology({"queues": {"orders": {}}})


def producer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "bandgate-producer"]


def test_no_broker_is_broker_unavailable_and_no_thread_stays() -> None:
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    with pytest.raises(BrokerUnavailable, match="cannot connect"):
        SyncProducer.connect(url, topology=TOPOLOGY, connect_timeout=2)
    assert producer_threads() == []


def test_a_missing_topology_file_is_raised_before_connecting(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(TopologyError, match="not found"):
        SyncProducer.connect("amqp://guest:guest@127.0.0.1:1/", topology=missing)
    assert producer_threads() == []


def test_the_topology_comes_from_bandgate_topology(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like the gateway and the workers: `BANDGATE_TOPOLOGY` names the file."""
    broken = tmp_path / "broken.toml"
    broken.write_text("queues = 3\n")
    monkeypatch.setenv("BANDGATE_TOPOLOGY", str(broken))
    with pytest.raises(TopologyError, match=str(broken)):
        SyncProducer.connect("amqp://guest:guest@127.0.0.1:1/")
    assert producer_threads() == []

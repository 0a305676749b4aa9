"""The roots cache answers from what a root holds, never from its name alone (sid moves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bandgate.ops.local_broker import LocalBroker, LocalBrokerError, installed_version
from tools import broker_roots
from tools.broker_roots import RootError


def fake_root(path: Path, version: str) -> Path:
    (path / "usr/lib/rabbitmq/lib" / f"rabbitmq_server-{version}").mkdir(parents=True)
    return path


def test_installed_version_reads_the_server_folder(tmp_path: Path) -> None:
    assert installed_version(fake_root(tmp_path, "4.3.6")) == "4.3.6"
    assert installed_version(tmp_path / "empty") is None


def test_a_cached_root_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(broker_roots, "ROOTS_DIR", tmp_path)
    fake_root(tmp_path / "trixie", "4.0.5")
    assert broker_roots.ensure_root("4.0") == tmp_path / "trixie"


def test_a_root_that_moved_to_another_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_roots, "ROOTS_DIR", tmp_path)
    fake_root(tmp_path / "sid", "4.30.1")  # starts with "4.3", is not 4.3.x
    with pytest.raises(RootError, match=r"holds RabbitMQ 4\.30\.1, not 4\.3\.x.*--rebuild 4\.3"):
        broker_roots.ensure_root("4.3")


def test_an_unknown_version_names_the_known_ones() -> None:
    with pytest.raises(RootError, match="choose one of 3.10, 4.0, 4.3"):
        broker_roots.root_for("3.13")


def test_a_node_refuses_a_root_without_rabbitmq(tmp_path: Path) -> None:
    node = LocalBroker(tmp_path / "node", root=tmp_path / "root")
    with pytest.raises(LocalBrokerError, match="make broker-roots"):
        node.start()

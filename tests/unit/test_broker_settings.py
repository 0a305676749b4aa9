"""Which broker a command picks, and how it names it (issue: the worker and the CLI looked for
another broker than the one `make run` started, and their errors did not say which)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bandgate.topology.dev_record import DevRecord, find_record, write_record
from bandgate.topology.settings import AMQP_URL_ENV, DEFAULT_AMQP_URL, BrokerSettings

DEV_URL = "amqp://guest:guest@127.0.0.1:5682/"


@pytest.fixture(autouse=True)
def nothing_exported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("BANDGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def record(dev_pid: int | None) -> DevRecord:
    return DevRecord(
        amqp_url=DEV_URL,
        management_url="http://guest:guest@127.0.0.1:15682",
        gateway_url="http://127.0.0.1:8000",
        node="bandgate-dev-0",
        dev_pid=dev_pid,
        node_pid=None,
    )


def test_without_a_record_the_default_is_used_and_named_as_such() -> None:
    settings = BrokerSettings()
    assert settings.amqp_url == DEFAULT_AMQP_URL
    assert not settings.chosen
    assert settings.describe_broker() == (
        "amqp://guest:***@127.0.0.1:5672/ (from the default (BANDGATE_AMQP_URL is not set); "
        "start one with `make run`, or set BANDGATE_AMQP_URL)"
    )


def test_a_running_dev_stack_is_found_from_a_subdirectory(tmp_path: Path) -> None:
    # A process whose command line names bandgate stands in for `bandgate dev`.
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "bandgate"], stdin=subprocess.PIPE
    )
    try:
        write_record(tmp_path, record(dev_pid=stand_in.pid))
        below = tmp_path / "src" / "app"
        below.mkdir(parents=True)
        os.chdir(below)
        settings = BrokerSettings()
    finally:
        assert stand_in.stdin is not None
        stand_in.stdin.close()
        stand_in.wait(10)
    assert "not running" not in settings.describe_broker()
    assert settings.amqp_url == DEV_URL
    assert settings.management_url == "http://guest:guest@127.0.0.1:15682"
    assert settings.chosen
    assert "dev.json, written by `bandgate dev`" in settings.describe_broker()


def test_a_stopped_dev_stack_is_still_the_broker_and_the_error_says_it_is_down(
    tmp_path: Path,
) -> None:
    write_record(tmp_path, record(dev_pid=None))
    settings = BrokerSettings()
    assert settings.amqp_url == DEV_URL  # never quietly another broker
    assert "`bandgate dev` is not running: start it with `make run`" in (settings.describe_broker())


def test_the_environment_and_arguments_win_over_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_record(tmp_path, record(dev_pid=None))
    monkeypatch.setenv(AMQP_URL_ENV, "amqp://u:p@broker:5672/v")
    from_env = BrokerSettings()
    assert from_env.amqp_url == "amqp://u:p@broker:5672/v"
    assert from_env.management_url is None
    assert from_env.describe_broker() == "amqp://u:***@broker:5672/v (from BANDGATE_AMQP_URL)"
    given = BrokerSettings(amqp_url="amqp://u:p@other:5672/")
    assert given.broker_source == "the URL given explicitly"


def test_a_torn_or_foreign_record_is_no_record(tmp_path: Path) -> None:
    (tmp_path / ".bandgate").mkdir()
    (tmp_path / ".bandgate" / "dev.json").write_text('{"amqp_url": ')
    assert find_record(tmp_path) is None
    (tmp_path / ".bandgate" / "dev.json").write_text('{"something": "else"}')
    assert find_record(tmp_path) is None


def test_the_record_is_private_to_its_owner(tmp_path: Path) -> None:
    path = write_record(tmp_path, record(dev_pid=None))
    assert path.stat().st_mode & 0o777 == 0o600

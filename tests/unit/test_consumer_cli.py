from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.cli import AppNotFound, load_app, worker
from bandgate.consumers.settings import WorkerSettings
from bandgate.topology.loader import parse_topology

ROOT = Path(__file__).resolve().parents[2]


def bandgate() -> typer.Typer:
    """The CLI as gateway/cli.py builds it: `worker` registered on a root Typer."""
    root = typer.Typer()
    root.command("worker")(worker)

    @root.command("version")
    def version() -> None: ...  # a second command, so `worker` is a subcommand

    return root


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("tests.unit.test_consumer_cli:nothing", "has no attribute 'nothing'"),
        ("tests.unit.test_consumer_cli:ROOT", "is a PosixPath, not a ConsumerApp"),
        (":app", "is not of the form module:attribute"),
    ],
)
def test_a_missing_module_or_app_exits_non_zero_with_a_clear_message(
    target: str, message: str
) -> None:
    result = CliRunner().invoke(bandgate(), ["worker", target])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_an_app_without_consumers_is_refused() -> None:
    result = CliRunner().invoke(bandgate(), ["worker", "tests.unit.test_consumer_cli:EMPTY"])
    assert result.exit_code == 2
    assert "has no consumers" in result.output


def test_load_app_finds_the_app_and_defaults_to_the_app_attribute() -> None:
    assert load_app("tests.unit.test_consumer_cli:EMPTY") is EMPTY
    with pytest.raises(AppNotFound, match="has no attribute 'app'"):
        load_app("tests.unit.test_consumer_cli")


def test_python_dash_m_consumers_runs_the_same_command() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bandgate.consumers", "no_such_module:app"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "bandgate worker: cannot import module 'no_such_module'" in completed.stderr


class _RecordingWorker:
    """Stands in for `consumers.worker.Worker`: keeps the settings it was given."""

    settings: list[WorkerSettings] = []

    def __init__(self, app: ConsumerApp, *, concurrency: int | None, settings: WorkerSettings):
        self.settings.append(settings)

    async def serve(self) -> None:
        pass


@pytest.mark.parametrize(
    ("arguments", "environment", "port"),
    [
        ([], {}, None),
        ([], {"BANDGATE_METRICS_PORT": "9100"}, 9100),
        (["--metrics-port", "9200"], {"BANDGATE_METRICS_PORT": "9100"}, 9200),
    ],
)
def test_metrics_port_option_overrides_the_environment(
    monkeypatch: pytest.MonkeyPatch, arguments: list[str], environment: dict[str, str], port: int
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("bandgate.consumers.cli.Worker", _RecordingWorker)
    monkeypatch.setattr("bandgate.consumers.cli.load_app", lambda _: _one_consumer_app())
    _RecordingWorker.settings = []
    result = CliRunner().invoke(bandgate(), ["worker", "tasks:app", *arguments])
    assert result.exit_code == 0, result.output
    [settings] = _RecordingWorker.settings
    assert settings.metrics_port == port


def test_metrics_port_must_be_a_port() -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        bandgate(), ["worker", "tasks:app", "--metrics-port", "70000"]
    )
    assert result.exit_code == 2
    assert "Invalid value for '--metrics-port'" in result.output


def _one_consumer_app() -> ConsumerApp:
    app = ConsumerApp(topology=parse_topology({"queues": {"orders": {}}}))

    @app.consumer("orders")
    async def handle(msg: Message) -> None: ...

    return app


EMPTY = ConsumerApp()


@pytest.mark.parametrize(
    ("environment", "fast_frames"),
    [
        ({}, True),
        ({"BANDGATE_FAST_FRAMES": "false"}, False),
        ({"BANDGATE_FAST_FRAMES": "true"}, True),
    ],
)
def test_the_worker_command_opts_into_fast_frames_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], fast_frames: bool
) -> None:
    """`bandgate worker` owns its process, so it reads frames with bandgate's decoder unless
    `BANDGATE_FAST_FRAMES=false`; a program running a ConsumerApp itself leaves it unset (off)."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("bandgate.consumers.cli.Worker", _RecordingWorker)
    monkeypatch.setattr("bandgate.consumers.cli.load_app", lambda _: _one_consumer_app())
    _RecordingWorker.settings = []
    result = CliRunner().invoke(bandgate(), ["worker", "tasks:app"])
    assert result.exit_code == 0, result.output
    [settings] = _RecordingWorker.settings
    assert settings.fast_frames is fast_frames

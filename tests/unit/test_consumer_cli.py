from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from consumers import ConsumerApp
from consumers.cli import AppNotFound, load_app, worker

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
        [sys.executable, "-m", "consumers", "no_such_module:app"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "bandgate worker: cannot import module 'no_such_module'" in completed.stderr


EMPTY = ConsumerApp()

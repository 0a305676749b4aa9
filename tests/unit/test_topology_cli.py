"""`bandgate topology export | show`, and `apply`'s failures that need no broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bandgate.ops.local_broker import free_port
from bandgate.ops.topology_cli import app, duration
from bandgate.topology import export
from bandgate.topology.loader import TOPOLOGY_ENV, load_topology
from bandgate.topology.settings import redact

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "bandgate.toml"


@pytest.fixture
def runner() -> CliRunner:
    # Wide enough that rich does not wrap the table; tests read the text, not the layout.
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "BANDGATE_AMQP_URL": None})


def test_help_lists_the_commands(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("apply", "export", "show"):
        assert command in result.stdout


def test_export_prints_definitions_json(runner: CliRunner) -> None:
    result = runner.invoke(app, ["export", "--topology", str(SHIPPED)])
    assert result.exit_code == 0, result.output
    expected = export.to_json(export.definitions(load_topology(SHIPPED)))
    assert result.stdout == expected
    assert json.loads(result.stdout)["users"] == []


def test_export_writes_a_file_for_a_vhost_with_the_dev_user(
    runner: CliRunner, tmp_path: Path
) -> None:
    output = tmp_path / "definitions.json"
    args = ["export", "--topology", str(SHIPPED), "--vhost", "dev", "--dev-user", "-o", str(output)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert f"Wrote {output}: 29 exchanges, 34 queues, 94 bindings in vhost 'dev'" in result.stderr
    document = json.loads(output.read_text(encoding="utf-8"))
    assert document["vhosts"] == [{"name": "dev"}]
    assert [user["name"] for user in document["users"]] == [export.DEV_USER]


def test_the_committed_file_is_what_the_documented_command_writes(
    runner: CliRunner, tmp_path: Path
) -> None:
    output = tmp_path / "definitions.json"
    result = runner.invoke(
        app, ["export", "--dev-user", "--output", str(output)], env={TOPOLOGY_ENV: str(SHIPPED)}
    )
    assert result.exit_code == 0, result.output
    assert output.read_bytes() == (ROOT / "rabbitmq" / "definitions.json").read_bytes()


def test_show_prints_every_band_and_the_delay_ladder(runner: CliRunner) -> None:
    result = runner.invoke(app, ["show", "--topology", str(SHIPPED)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in (
        "orders.hot",
        "orders.warm",
        "orders.cold",
        "emails.hot",
        "emails.cold",
        "7-9",
        "classic, x-max-priority 4",
        "after 10 min to hot",
        "after 30 min to warm",
        "5 attempts, back-off 1 s x2 up to 5 min, then orders.dlq",
        "8 attempts, back-off 5 s x2 up to 5 min, then emails.dlq",
        "routing key <queue>.<priority>",
        "Delay ladder: 26 levels, zz.bandgate.delay.00 (50 ms) to zz.bandgate.delay.25 (19.4 days)",
        "delays up to 38.8 days in 50 ms steps",
        "'zz.bandgate.delay.out'",
    ):
        assert text in out, text
    rows = [line for line in out.splitlines() if "quorum" in line or "classic" in line]
    assert len(rows) == 5


def test_an_invalid_topology_is_one_line_on_stderr_and_exit_1(
    runner: CliRunner, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[queues.orders]\nbands = [{name = "hot", priorities = [5, 9]}]\n')
    for command in ("show", "export", "apply"):
        result = runner.invoke(app, [command, "--topology", str(bad)])
        assert result.exit_code == 1
        assert result.stdout == ""
        assert result.stderr == (
            f"error: {bad}: queue 'orders': no band covers priorities 0-4; bands must cover 0-9\n"
        )


def test_a_missing_topology_file(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["show"], env={TOPOLOGY_ENV: str(tmp_path / "nope.toml")})
    assert result.exit_code == 1
    assert "nope.toml: topology file not found" in result.stderr


def test_apply_without_a_broker_says_where_it_tried_and_hides_the_password(
    runner: CliRunner,
) -> None:
    url = f"amqp://guest:s3cret@127.0.0.1:{free_port()}/"
    result = runner.invoke(app, ["apply", "--topology", str(SHIPPED), "--amqp-url", url])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(
        f"error: cannot connect to RabbitMQ at {url.replace('s3cret', '***')} "
        "(from the URL given explicitly): "
    )
    assert "s3cret" not in result.output
    assert "Traceback" not in result.output


def test_redact() -> None:
    assert redact("amqp://u:p@host:5672/v") == "amqp://u:***@host:5672/v"
    assert redact("amqp://host/") == "amqp://host/"
    assert redact("http://u:p%40ss@host") == "http://u:***@host"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.05, "50 ms"),
        (1, "1 s"),
        (90, "90 s"),
        (300, "5 min"),
        (600, "10 min"),
        (7200, "2 h"),
        (3 * 86400, "3 days"),
        (2 * 365 * 86400, "2 years"),
    ],
)
def test_duration(seconds: float, text: str) -> None:
    assert duration(seconds) == text

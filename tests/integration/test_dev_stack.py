"""`bandgate dev` starts again over its own data however its last run ended, and tells the
other commands where its broker is (issue: `make run` worked once, then failed on every start
with `home node ... of durable queue 'zz.bandgate.ledger' ... is down or inaccessible`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bandgate.ops.local_broker import free_port
from bandgate.topology.dev_record import DevRecord
from tests.integration.dev_stack import DevStack, clean_environment

# `bandgate dev` runs the installed RabbitMQ, whatever version the session's nodes run.
pytestmark = [pytest.mark.integration, pytest.mark.broker_independent]

ROOT = Path(__file__).resolve().parents[2]
BANDGATE = str(Path(sys.executable).parent / "bandgate")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[DevStack]:
    shutil.copy(ROOT / "bandgate.toml", tmp_path / "bandgate.toml")
    port = free_port()
    dev = DevStack(tmp_path, [BANDGATE, "dev", "--port", str(port)], clean_environment())
    try:
        yield dev
    finally:
        dev.close()


def publish(record: DevRecord, order_id: int, priority: int) -> None:
    response = httpx.post(
        f"{record.gateway_url}/v1/queues/orders/messages",
        json={"payload": {"order_id": order_id}, "priority": priority},
        timeout=30,
    )
    assert response.status_code == 201, response.text


def second_shell(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`bandgate ARGS` from a second shell: nothing exported, in the same directory."""
    return subprocess.run(
        [BANDGATE, *args],
        cwd=directory,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ready_counts(directory: Path) -> dict[str, int]:
    result = second_shell(directory, "stats", "orders", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    return {band["band"]: band["ready"] for band in stats["bands"]}


def test_restarts_over_its_data_after_ctrl_c_a_node_crash_and_its_own_kill(
    stack: DevStack,
) -> None:
    first = stack.start()
    assert first.node is not None
    publish(first, 1, 8)
    publish(first, 2, 1)
    assert stack.interrupt() == 0
    assert stack.record.dev_pid is None  # a clean stop says so

    second = stack.start()
    assert ready_counts(stack.directory) == {"hot": 1, "warm": 0, "cold": 1}
    publish(second, 3, 5)

    stack.kill_node()  # the broker crashes under the running stack
    stack.interrupt()
    third = stack.start()
    assert ready_counts(stack.directory) == {"hot": 1, "warm": 1, "cold": 1}
    publish(third, 4, 9)

    stack.kill()  # `bandgate dev` itself dies; its node lives on in a session of its own
    fourth = stack.start()
    assert "left running" in stack.log.read_text()
    assert fourth.amqp_url == first.amqp_url or fourth.node == first.node
    assert ready_counts(stack.directory) == {"hot": 2, "warm": 1, "cold": 1}
    assert stack.interrupt() == 0


def test_a_second_dev_in_the_same_directory_is_refused(stack: DevStack) -> None:
    record = stack.start()
    # The HTTP commands find this gateway (on a port of its own here) through the record too.
    publish(record, 9, 8)
    received = second_shell(stack.directory, "receive", "orders", "--wait", "5", "--ack")
    assert received.returncode == 0, received.stderr
    assert json.loads(received.stdout)["payload"] == {"order_id": 9}
    result = second_shell(stack.directory, "dev", "--port", str(free_port()))
    assert result.returncode == 1
    assert "already runs here" in result.stderr
    assert record.gateway_url in result.stderr.replace("\n", "")
    assert httpx.get(f"{record.gateway_url}/readyz", timeout=5).status_code == 200


def test_commands_say_which_broker_failed_and_what_chose_it(stack: DevStack) -> None:
    stack.start()
    stack.interrupt()
    result = second_shell(stack.directory, "stats", "orders")
    message = " ".join(result.stderr.split())
    assert result.returncode == 1
    assert stack.record.amqp_url.replace("guest:guest", "guest:***") in message
    assert "dev.json" in message
    assert "`bandgate dev` is not running" in message


def test_no_page_of_another_site_or_host_drives_the_dev_gateway(stack: DevStack) -> None:
    """Issue 33, finding 7: authentication is off here, so a page on another origin replayed
    the DLQ with a body-less no-cors POST, and DNS rebinding could reach it under the
    attacker's own host name (then Origin and Host agree)."""
    record = stack.start()
    replay = f"{record.gateway_url}/v1/queues/orders/dlq/replay"
    port = record.gateway_url.rsplit(":", 1)[1]
    cross_site = httpx.post(replay, headers={"origin": "http://evil.example"}, timeout=10)
    assert (cross_site.status_code, cross_site.json()["error"]["code"]) == (
        403,
        "cross_site_request",
    )
    rebound = {"host": f"evil.example:{port}", "origin": f"http://evil.example:{port}"}
    rebinding = httpx.post(replay, headers=rebound, timeout=10)
    assert (rebinding.status_code, rebinding.json()["error"]["code"]) == (403, "host_not_allowed")
    read = httpx.get(f"{record.gateway_url}/v1/queues", headers={"host": "evil.example"})
    assert read.status_code == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        listed = httpx.get(f"{record.gateway_url}/v1/queues", headers={"host": host}, timeout=10)
        assert listed.status_code == 200, (host, listed.text)
    publish(record, 1, 5)  # what the README's curl commands send (its First steps)

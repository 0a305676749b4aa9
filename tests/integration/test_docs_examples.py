"""The docs' curl examples, run as written against a gateway served on a port, authentication
off as `make run` serves it: each command's `localhost:8000` becomes the test gateway's
address, `$ID` is a message the page's reader has published, `$RECEIPT` the receipts of the
receive before, and each command answers the status its comment shows (2xx where it shows
none). The README's own commands are run by test_readme.py; the Python examples by
test_producer.py; the Node worker by test_http_worker_example.py."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.integration.live_gateway import LiveGateway

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ROOT / "docs" / "guides"
STATUS = re.compile(r"#\s*(?:[a-z ]+:\s*)?(\d{3})\b")


def curl_commands(page: Path) -> list[tuple[str, int | None]]:
    """Each `curl` command of the page's ```sh blocks (continued lines joined), with the status
    its comment shows: on its own line (`# 200 {...}`) or after it (`# ack: 204`)."""
    found: list[tuple[str, int | None]] = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        command = ""
        for line in block.splitlines():
            if command:
                command = f"{command}\n{line}"
            elif line.startswith("curl"):
                command = line
            elif (said := STATUS.match(line)) and found and found[-1][1] is None:
                found[-1] = (found[-1][0], int(said[1]))
            if command and not line.rstrip().endswith("\\") and command.count("'") % 2 == 0:
                inline = STATUS.search(line)
                found.append((command, int(inline[1]) if inline else None))
                command = ""
    return found


@pytest.fixture
def gateway(broker: TestBroker, amqp_url: str, topology: Topology) -> Iterator[LiveGateway]:
    settings = GatewaySettings(
        amqp_url=amqp_url,
        management_url=broker.management_url,
        port=free_port(),
        auth_enabled=False,
    )
    with LiveGateway(settings, topology) as served:
        yield served


def run(command: str, gateway: LiveGateway, **env: str) -> tuple[int, str]:
    """The command as written (its address the test gateway's), with curl's status after."""
    port = gateway.url.rsplit(":", 1)[1]
    *lines, last = re.sub(r"\blocalhost:8000\b", f"127.0.0.1:{port}", command).split("\n")
    script = "\n".join([*lines, last.split("  #", 1)[0].rstrip()])  # its comment aside
    result = subprocess.run(
        ["bash", "-c", f"{script} -s -w '\\n%{{http_code}}'"],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    body, status = result.stdout.rsplit("\n", 1)
    return int(status), body


def check(command: str, expected: int | None, status: int, body: str) -> None:
    if expected is None:
        assert 200 <= status < 300, (command, status, body)
    else:
        assert status == expected, (command, status, body)
    if body:
        json.loads(body)  # every answer is JSON


def publish(gateway: LiveGateway, **message: object) -> None:
    answer = httpx.post(f"{gateway.url}/v1/queues/orders/messages", json=message, timeout=30)
    assert answer.status_code == 201, answer.text


def test_the_pages_show_the_commands_the_tests_run() -> None:
    """The parser finds what the pages show (else the tests below would pass on nothing)."""
    assert [s for _, s in curl_commands(GUIDES / "publish-http.md")] == [None, 200]
    assert [s for _, s in curl_commands(GUIDES / "consume-http.md")] == [200, 204, 200]
    assert [s for _, s in curl_commands(GUIDES / "cancel-replace-escalate.md")] == [202, 201, None]


def test_publishing_over_http_as_the_page_shows(gateway: LiveGateway) -> None:
    commands = curl_commands(GUIDES / "publish-http.md")
    answers = [run(command, gateway) for command, _ in commands]
    for (command, expected), (status, body) in zip(commands, answers, strict=True):
        check(command, expected, status, body)
    batch = json.loads(answers[1][1])
    assert [item["band"] for item in batch["successful"]] == ["hot"]
    assert [item["error"]["code"] for item in batch["failed"]] == ["invalid_priority"]


def test_consuming_over_http_as_the_page_shows(gateway: LiveGateway) -> None:
    publish(gateway, payload={"order_id": 1}, priority=8)
    publish(gateway, payload={"order_id": 2}, priority=8)
    commands = curl_commands(GUIDES / "consume-http.md")
    receive, *settle = commands
    status, body = run(receive[0], gateway)
    check(*receive, status, body)
    receipts = [message["receipt"] for message in json.loads(body)["messages"]]
    assert len(receipts) == 2
    for (command, expected), receipt in zip(settle, receipts, strict=True):
        check(command, expected, *run(command, gateway, RECEIPT=receipt))


def test_cancel_replace_and_escalate_as_the_page_shows(gateway: LiveGateway) -> None:
    publish(gateway, payload={"order_id": 42}, priority=1, message_id="order-42")
    for command, expected in curl_commands(GUIDES / "cancel-replace-escalate.md"):
        check(command, expected, *run(command, gateway, ID="order-42"))

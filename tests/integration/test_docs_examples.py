"""The docs' curl examples, run as written against a gateway served on a port, authentication
off as `make run` serves it: each command's `localhost:8000` becomes the test gateway's
address, `$ID` is a message the page's reader has published, `$RECEIPT` the receipts of the
receive before, and each command answers the status its comment shows (2xx where it shows
none). The README's own commands are run by test_readme.py; the Python examples by
test_producer.py; the Node worker by test_http_worker_example.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection

from bandgate import Producer
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology import wire
from bandgate.topology.declare import apply_topology
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from bandgate.topology.placement import fair_share
from tests.broker import TestBroker
from tests.integration.conftest import queue_depths
from tests.integration.live_gateway import LiveGateway
from tests.integration.test_dead_letters import get_all, write_topology
from tools.local_cluster import LocalCluster

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GUIDES = ROOT / "docs" / "guides"
STATUS = re.compile(r"#\s*(?:[a-z ]+:\s*)?(\d{3})\b")
VENV_BIN = ROOT / ".venv" / "bin"


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
    assert [s for _, s in curl_commands(GUIDES / "tenants.md")] == [None]
    assert len(blocks(GUIDES / "tenants.md", "python")) == 1
    assert len(blocks(GUIDES / "observability.md", "sh")) == 3
    assert [s for _, s in curl_commands(GUIDES / "observability.md")] == [200, None]
    assert len(topology_examples()) >= 3


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


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def commands(block: str) -> list[str]:
    """A block's commands, each line one, their comments aside."""
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def shell(command: str, directory: Path, **env: str) -> str:
    """`command` in a fresh bash, the virtualenv's `bandgate` on PATH as `source
    .venv/bin/activate` puts it; the output of a command that succeeded."""
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=directory,
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(directory), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def topology_examples() -> list[tuple[str, str]]:
    """Every ```toml block of the docs (rglob("*.md")) but the included bandgate.toml, which
    `make run` applies in test_readme.py."""
    return [
        (str(path.relative_to(ROOT)), block)
        for path in sorted((ROOT / "docs").rglob("*.md"))
        for block in blocks(path, "toml")
        if not block.startswith("--8<--")
    ]


def test_every_topology_example_applies_to_a_broker(broker: TestBroker) -> None:
    """guides/topology.md, ordered-sharded.md, tenants.md...: each example, declared on a vhost
    of its own as `bandgate topology apply` declares it, gives the queues it says it does."""
    for page, block in topology_examples():
        topology = parse_topology(tomllib.loads(block))
        with broker.fresh_vhost() as vhost:
            asyncio.run(declared(broker.vhost_url(vhost), topology))
            with broker.management() as api:
                listed = api.get(f"/api/queues/{vhost}").json()
            names = {queue["name"] for queue in listed}
            for spec in topology.queues.values():
                for band in spec.bands:
                    assert f"{spec.name}.{band.name}" in names or any(
                        name.startswith(f"{spec.name}.{band.name}.") for name in names
                    ), (page, band.name, sorted(names))


async def declared(amqp_url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        await apply_topology(connection, topology)


async def test_publishing_with_a_tenant_as_the_page_shows(
    gateway: LiveGateway, amqp_url: str, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    """tenants.md: the curl command and the Python line, each publishing order 42 low with the
    tenant acme: both land in the cold band, carrying the tenant."""
    page = GUIDES / "tenants.md"
    [(command, expected)] = curl_commands(page)
    status, body = await asyncio.to_thread(run, command, gateway)
    check(command, expected, status, body)
    [line] = blocks(page, "python")
    code = compile(f"async def example(producer):\n    {line.strip()}\n", str(page), "exec")
    scope: dict[str, object] = {}
    exec(code, scope)  # the page's line, as the body of a function given a producer
    async with Producer.connect(amqp_url, topology=topology) as producer:
        await scope["example"](producer)  # type: ignore[operator]
    cold = await get_all(amqp, "orders.cold")
    assert [json.loads(m.body) for m in cold] == [{"order": 42}, {"order": 42}]
    assert [(m.headers or {}).get(wire.TENANT) for m in cold] == ["acme", "acme"]
    assert sum((await queue_depths(amqp, topology)).values()) == 0


def test_the_statistics_and_the_doctor_as_the_page_shows(
    gateway: LiveGateway, broker: TestBroker, amqp_url: str, topology: Topology, tmp_path: Path
) -> None:
    """observability.md: `bandgate stats orders` and `bandgate doctor` as written, in a
    directory holding the deployment's bandgate.toml, with the broker's URLs exported as a
    deployment exports them; the stats agree with `GET /v1/queues/orders/stats`."""
    stats_block, doctor_block = blocks(GUIDES / "observability.md", "sh")[:2]
    [stats] = commands(stats_block)
    [doctor] = commands(doctor_block)
    assert (stats, doctor) == ("bandgate stats orders", "bandgate doctor")
    write_topology(topology, tmp_path).rename(tmp_path / "bandgate.toml")
    env = {"BANDGATE_AMQP_URL": amqp_url, "BANDGATE_MANAGEMENT_URL": broker.management_url}
    publish(gateway, payload={"order_id": 1}, priority=8)
    publish(gateway, payload={"order_id": 2}, priority=1)
    table = shell(stats, tmp_path, **env)
    assert all(band in table for band in ("hot", "warm", "cold")), table
    shown = json.loads(shell(f"{stats} --json", tmp_path, **env))
    served = httpx.get(f"{gateway.url}/v1/queues/orders/stats", timeout=30).json()
    ready = {band["band"]: band["ready"] for band in shown["bands"]}
    assert ready == {band["band"]: band["ready"] for band in served["bands"]}
    assert ready == {"hot": 1, "warm": 0, "cold": 1}
    report = shell(doctor, tmp_path, **env)
    assert re.search(r"\b0 error\(s\)", report), report


def test_receiving_from_a_shell_as_the_page_shows(gateway: LiveGateway, tmp_path: Path) -> None:
    """consume-http.md's "Run it against `make run`'s gateway": the Node worker with the
    page's environment takes a message and acks it (node installed), and `bandgate receive`
    prints one JSON line per message. `make run`'s address is the test gateway's, given to
    `bandgate receive` as `make run` records it for the CLI: through BANDGATE_GATEWAY_URL."""
    node_line, receive_line = commands(blocks(GUIDES / "consume-http.md", "sh")[-1])
    address = {"BANDGATE_GATEWAY_URL": gateway.url}
    publish(gateway, payload={"order_id": 1}, priority=8)
    publish(gateway, payload={"order_id": 2}, priority=1)
    printed = shell(receive_line, tmp_path, **address).splitlines()
    assert sorted(json.loads(line)["payload"]["order_id"] for line in printed) == [1, 2]
    if shutil.which("node") is None:
        pytest.skip("node is not installed: test_http_worker_example.py says the same")
    run_node(node_line.replace("http://127.0.0.1:8000", gateway.url), gateway)


def run_node(command: str, gateway: LiveGateway) -> None:
    """The worker started as written settles a message published for it (the two above stay
    leased to the shell's receive), then stops on SIGTERM with exit status 0."""
    publish(gateway, payload={"order_id": 3}, priority=8, message_id="order-3")
    worker = subprocess.Popen(
        ["bash", "-c", f"exec env {command}"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": os.environ.get("HOME", "/")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert worker.stdout is not None
        for line in worker.stdout:
            if line.startswith("{") and json.loads(line)["id"] == "order-3":
                assert json.loads(line)["action"] == "ack", line
                break
        else:
            pytest.fail("the worker ended without handling order 3")
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
    assert worker.returncode == 0, output


@pytest.mark.fault
def test_the_cluster_pages_steps_on_three_nodes(cluster: LocalCluster, tmp_path: Path) -> None:
    """deploy/cluster.md's "The topology, applied once", as written on a local three-node
    cluster: the page's user, password and vhost are made on it, `rabbit-N` is node N's address
    and /etc/bandgate/bandgate.toml the shipped topology file. The topology applies, the doctor
    finds no error, and the leaders spread over the three nodes as the page says: none leads
    more than an even share plus one."""
    page = (ROOT / "docs" / "deploy" / "cluster.md").read_text(encoding="utf-8")
    [block] = re.findall(r"## 2\. The topology, applied once\n.*?```sh\n(.*?)```", page, re.S)
    first = cluster.nodes[0]
    first.ctl("add_user", "bandgate", "secret")
    first.ctl("set_user_tags", "bandgate", "administrator")
    first.ctl("add_vhost", "prod")
    first.ctl("set_permissions", "-p", "prod", "bandgate", ".*", ".*", ".*")
    script = block.replace("/etc/bandgate/bandgate.toml", str(ROOT / "bandgate.toml"))
    script = script.replace("rabbit-1:15672", f"127.0.0.1:{first.management_port}")
    for number, node in enumerate(cluster.nodes, start=1):
        script = script.replace(f"rabbit-{number}:5672", f"127.0.0.1:{node.amqp_port}")
    assert "rabbit-" not in script, script
    report = shell(f"set -e\n{script}", tmp_path)
    assert re.search(r"\b0 error\(s\)", report), report
    leaders = cluster.leaders("prod")
    assert len(leaders) >= 10, leaders
    per_node = Counter(leaders.values())
    assert len(per_node) == 3, per_node
    assert max(per_node.values()) <= fair_share(len(leaders), 3), per_node  # as the doctor


def test_the_health_and_the_metrics_as_the_page_shows(gateway: LiveGateway) -> None:
    """observability.md's curl commands: /readyz answers 200 with the broker's version, and
    /metrics, after one publish to the hot band, counts it as the comment shows."""
    readyz, metrics = curl_commands(GUIDES / "observability.md")
    status, body = run(readyz[0], gateway)
    check(*readyz, status, body)
    assert json.loads(body)["status"] == "ready"
    publish(gateway, payload={"order_id": 1}, priority=8)
    status, text = run(metrics[0], gateway)
    assert status == 200, text
    said = re.search(r"# Prometheus text: (\w+)\{([^}]*)\} ([\d.]+)", metrics[0])
    assert said is not None, metrics[0]
    name, labels, value = said.groups()
    line = next(line for line in text.splitlines() if line.startswith(f"{name}{{"))
    shown = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
    assert dict(re.findall(r'(\w+)="([^"]*)"', labels)).items() <= shown.items(), line
    assert float(line.rsplit(" ", 1)[1]) == float(value), line

"""The test session's RabbitMQ: a configured one, or a private node started for the session.

`BANDGATE_TEST_RABBITMQ=3.10|4.0|4.3` picks the version of every private node the tests start
(default: the installed `rabbitmq-server`); other versions run from Debian roots cached under
`.bandgate/roots/` (tools/broker_roots.py builds a missing one first, one to three minutes).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from bandgate.ops.local_broker import ROOT_ENV, LocalBroker, rabbitmq_installed
from bandgate.topology.management import split_credentials
from tools import broker_roots

AMQP_ENV = "BANDGATE_TEST_AMQP_URL"
MANAGEMENT_ENV = "BANDGATE_TEST_MANAGEMENT_URL"
VERSION_ENV = "BANDGATE_TEST_RABBITMQ"


def select_rabbitmq() -> Path | None:
    """Point `BANDGATE_RABBITMQ_ROOT` at the chosen version's root (None: the installed server),
    so that every LocalBroker of this process and of its child processes runs that version;
    this setting alone decides it, whatever a developer exported for `bandgate dev`."""
    version = os.environ.get(VERSION_ENV)
    root = broker_roots.root_for(version) if version else None
    if root is None:
        os.environ.pop(ROOT_ENV, None)
    else:
        os.environ[ROOT_ENV] = str(root)
    return root


# Done on import: the root conftest imports this module before any fixture runs, and fault tests
# build their own LocalBroker without asking the session for anything.
select_rabbitmq()


@dataclass(frozen=True)
class TestBroker:
    """Where the session's broker listens; `vhost_url` gives each test its own vhost."""

    __test__ = False  # not a test class, despite the name

    amqp_url: str
    management_url: str
    node: LocalBroker | None = None  # the private node, when the session started one

    def vhost_url(self, vhost: str) -> str:
        scheme, netloc, _, query, fragment = urlsplit(self.amqp_url)
        return urlunsplit((scheme, netloc, "/" + quote(vhost, safe=""), query, fragment))

    def management(self) -> httpx.Client:
        base, auth = split_credentials(self.management_url)
        return httpx.Client(base_url=base, auth=auth, timeout=30)

    @contextmanager
    def fresh_vhost(self) -> Iterator[str]:
        """A vhost of its own for one test, deleted afterwards with all it holds."""
        name = f"test-{uuid.uuid4().hex[:12]}"
        encoded = quote(name, safe="")
        with self.management() as api:
            api.put(f"/api/vhosts/{encoded}").raise_for_status()
            api.put(
                f"/api/permissions/{encoded}/guest",
                json={"configure": ".*", "write": ".*", "read": ".*"},
            ).raise_for_status()
        try:
            yield name
        finally:
            with self.management() as api:
                api.delete(f"/api/vhosts/{encoded}")


@contextmanager
def session_broker(tmp_dir: Path) -> Iterator[TestBroker]:
    """`BANDGATE_TEST_AMQP_URL` when set; else a private node of the selected version;
    else, where a Docker engine answers, a RabbitMQ container."""
    url = os.environ.get(AMQP_ENV)
    if url:
        host = urlsplit(url).hostname or "127.0.0.1"
        yield TestBroker(url, os.environ.get(MANAGEMENT_ENV, f"http://guest:guest@{host}:15672"))
        return
    if not rabbitmq_installed() and ROOT_ENV not in os.environ and docker_available():
        with container_broker() as broker:
            yield broker
        return
    node = LocalBroker(tmp_dir / "rabbitmq", name=f"bandgate-test-{uuid.uuid4().hex[:6]}")
    node.start()
    try:
        yield TestBroker(node.amqp_url, node.management_url, node)
    finally:
        node.stop()


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
    except Exception:  # no client library, no engine, no permission: all mean "no Docker"
        return False
    return True


@contextmanager
def container_broker(image: str = "rabbitmq:3.13-management") -> Iterator[TestBroker]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    container = DockerContainer(image).with_exposed_ports(5672, 15672)
    with container:
        wait_for_logs(container, "Server startup complete", timeout=120)
        host = container.get_container_host_ip()
        amqp, management = container.get_exposed_port(5672), container.get_exposed_port(15672)
        yield TestBroker(
            f"amqp://guest:guest@{host}:{amqp}/", f"http://guest:guest@{host}:{management}"
        )

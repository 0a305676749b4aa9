"""Several node addresses in one setting, and the connection that moves between them."""

from __future__ import annotations

import pytest

from bandgate.core.cluster_connection import ClusterConnection, connect
from bandgate.ops.local_broker import free_port
from bandgate.topology.management import vhost_of
from bandgate.topology.settings import node_urls, redact

URLS = "amqp://u:p@a:5672/v, amqp://u:p@b:5672/v,amqp://u:p@c:5672/v"


def test_a_list_of_addresses_is_read_redacted_and_names_one_vhost() -> None:
    assert node_urls(URLS) == (
        "amqp://u:p@a:5672/v",
        "amqp://u:p@b:5672/v",
        "amqp://u:p@c:5672/v",
    )
    assert node_urls("amqp://u:p@a:5672/") == ("amqp://u:p@a:5672/",)
    assert redact(URLS) == "amqp://u:***@a:5672/v,amqp://u:***@b:5672/v,amqp://u:***@c:5672/v"
    assert vhost_of(URLS) == "v"


async def test_every_attempt_after_the_first_goes_to_the_next_address() -> None:
    """aio-pika clears `transport` right before each connection attempt; the address moves
    there."""
    connection = ClusterConnection(node_urls(URLS), first=1)
    try:
        assert connection.url.host == "b"
        connection.transport = None  # the first attempt: stays on b
        assert connection.url.host == "b"
        connection.transport = None  # the next attempt: c, then around to a
        assert connection.url.host == "c"
        connection.transport = None
        assert connection.url.host == "a"
    finally:
        await connection.close()


async def test_the_cli_connection_tries_each_address_and_reports_the_last_failure() -> None:
    urls = ",".join(f"amqp://guest:guest@127.0.0.1:{free_port()}/" for _ in range(2))
    with pytest.raises(ConnectionError):
        await connect(urls, connect_timeout=2)

"""Connections that know the whole cluster: several node addresses, tried in turn.

`BANDGATE_AMQP_URL` may list the nodes of a cluster, comma-separated. aio-pika's robust
connection reconnects only to the one URL it was given (mosquito/aio-pika#141), so a client
whose node died waited for that node. `ClusterConnection` is a `RobustConnection` that moves
to the next address for every new attempt: after its node goes down, it reconnects through
the next one that answers, and aio-pika restores its channels, queues and consumers there.

The one place bandgate leans on aio-pika's insides: its robust connection clears `transport`
right before every connection attempt (`RobustConnection.__connect_transport`, aio-pika 9.4
to 10.x), which is where the next address is taken. `tests/integration/test_cluster_clients.py`
kills the node a gateway and a worker are connected to, on a real cluster.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, cast

import aio_pika
import aiormq
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from yarl import URL

from bandgate.topology.settings import node_urls

CONNECT_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError)


class ClusterConnection(aio_pika.RobustConnection):
    """A robust connection over a list of node addresses (module docstring)."""

    def __init__(self, urls: Sequence[str], first: int = 0, **kwargs: Any) -> None:
        self._urls = tuple(URL(url) for url in urls)
        self._index = first % len(self._urls)
        self._attempted = False
        self._ready = False
        super().__init__(self._urls[self._index], **kwargs)
        self._ready = True

    @property
    def url(self) -> URL:
        return self._urls[self._index]

    @url.setter
    def url(self, value: URL) -> None:
        """aio-pika's constructor sets it; the list decides."""

    @property
    def transport(self) -> Any:
        return self.__dict__.get("_cluster_transport")

    @transport.setter
    def transport(self, value: Any) -> None:
        # Cleared before each connection attempt: the first one goes to the address this
        # connection starts at, every later one to the next address in the list.
        if value is None and self._ready:
            if self._attempted:
                self._index = (self._index + 1) % len(self._urls)
            self._attempted = True
        self.__dict__["_cluster_transport"] = value


async def connect_robust(
    amqp_url: str, *, connect_timeout: float | None = None, **kwargs: Any
) -> AbstractRobustConnection:
    """A robust connection to the first node of `amqp_url` that answers, starting at a random
    one so that clients spread over the cluster; with one address, aio-pika's own behaviour.
    Raises the last node's error when none answers."""
    urls = node_urls(amqp_url)
    if len(urls) == 1:
        single = await aio_pika.connect_robust(urls[0], timeout=connect_timeout, **kwargs)
        return cast(AbstractRobustConnection, single)
    start = random.randrange(len(urls))
    failure: BaseException | None = None
    for step in range(len(urls)):
        connection = ClusterConnection(urls, start + step, **kwargs)
        try:
            await connection.connect(timeout=connect_timeout)
        except CONNECT_ERRORS as exc:
            failure = exc
            await connection.close()
            continue
        return connection
    assert failure is not None
    raise failure


async def connect(
    amqp_url: str, *, connect_timeout: float | None = None, **kwargs: Any
) -> AbstractConnection:
    """A plain connection (the CLI's) to the first node of `amqp_url` that answers, in order."""
    failure: BaseException | None = None
    for url in node_urls(amqp_url):
        try:
            opened = await aio_pika.connect(url, timeout=connect_timeout, **kwargs)
            return cast(AbstractConnection, opened)
        except CONNECT_ERRORS as exc:
            failure = exc
    assert failure is not None
    raise failure


__all__ = ["CONNECT_ERRORS", "ClusterConnection", "connect", "connect_robust"]

"""A small client for the RabbitMQ management HTTP API.

AMQP cannot tell a queue's arguments or its unacked count; the management API can. Everything
that uses it treats it as optional: without a management URL, callers fall back to AMQP.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import httpx


def split_credentials(url: str) -> tuple[str, tuple[str, str]]:
    """`http://user:pass@host:port` as (`http://host:port`, (user, pass))."""
    parts = urlsplit(url)
    netloc = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    base = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return base.rstrip("/"), (
        unquote(parts.username or "guest"),
        unquote(parts.password or "guest"),
    )


class ManagementClient:
    def __init__(self, url: str, vhost: str = "/", timeout: float = 5.0) -> None:
        self._base, self._auth = split_credentials(url)
        self._vhost = quote(vhost, safe="")
        self._timeout = timeout

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self._base, auth=self._auth, timeout=self._timeout)

    async def queue(self, name: str) -> dict[str, Any] | None:
        """The management API's view of one queue, or None when it does not exist."""
        async with self._client() as client:
            response = await client.get(f"/api/queues/{self._vhost}/{quote(name, safe='')}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    async def queues(self) -> list[dict[str, Any]]:
        """Every queue of the vhost with its statistics. A queue the statistics database has
        not sampled yet (the first 5 s of a classic queue, up to 10 s of a quorum queue: one
        `collect_statistics_interval`, after one Ra tick) is listed without any counts."""
        return await self._list_queues({})

    async def queue_counts(self) -> list[dict[str, Any]]:
        """Every queue of the vhost with only its message counts (`messages_ready`,
        `messages_unacknowledged`), read from the broker's own counters rather than the
        statistics database (`disable_stats`, `enable_queue_totals`): present from a queue's
        declaration on (seen on 3.10.8 and 4.3.6). A classic queue's are current; a quorum
        queue's are as of its last Ra tick (every 5 s; zeros before the first one)."""
        return await self._list_queues({"disable_stats": "true", "enable_queue_totals": "true"})

    async def _list_queues(self, params: dict[str, str]) -> list[dict[str, Any]]:
        async with self._client() as client:
            response = await client.get(f"/api/queues/{self._vhost}", params=params)
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result


def vhost_of(amqp_url: str) -> str:
    """The vhost an AMQP URL names ('/' when it names none); of a cluster's list of node
    URLs, the first one's (they name one vhost)."""
    path = urlsplit(amqp_url.split(",", 1)[0].strip()).path
    return unquote(path[1:]) if len(path) > 1 else "/"

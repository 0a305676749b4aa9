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
        async with self._client() as client:
            response = await client.get(f"/api/queues/{self._vhost}")
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result


def vhost_of(amqp_url: str) -> str:
    """The vhost an AMQP URL names ('/' when it names none)."""
    path = urlsplit(amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"

"""A minimal HTTP/1.1 keep-alive client over asyncio streams, for paced runs and receive loops.

httpx and similar clients spend more CPU per request than the gateway does, so at a few
hundred requests per second they measure their own queueing, not the gateway's latency.
"""

from __future__ import annotations

import asyncio


class RawHttp:
    def __init__(self, host: str, port: int, connections: int) -> None:
        self.host = host
        self.port = port
        self.size = connections
        self._idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.Queue()
        )

    async def open(self) -> None:
        for _ in range(self.size):
            self._idle.put_nowait(await asyncio.open_connection(self.host, self.port))

    async def close(self) -> None:
        while not self._idle.empty():
            _, writer = self._idle.get_nowait()
            writer.close()

    async def post(self, path: str, body: bytes) -> int:
        """POST `body` as JSON; returns the status code after reading the whole response."""
        status, _ = await self.request("POST", path, body)
        return status

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send `body` as JSON; the status code and the response body.

        A connection the server closed while idle (keep-alive timeout) is reopened once.
        """
        reader, writer = await self._idle.get()
        try:
            return await self._exchange(reader, writer, method, path, body)
        except (ConnectionError, IndexError, asyncio.IncompleteReadError):
            writer.close()
            reader, writer = await asyncio.open_connection(self.host, self.port)
            return await self._exchange(reader, writer, method, path, body)
        finally:
            self._idle.put_nowait((reader, writer))

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        method: str,
        path: str,
        body: bytes,
    ) -> tuple[int, bytes]:
        writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        status_line = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(status_line.split()[1]), await reader.readexactly(length)

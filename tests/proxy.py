"""A TCP proxy that tests can cut: every open connection is dropped and new ones refused
until it is restored, the way a network partition looks to a client."""

from __future__ import annotations

import asyncio
import contextlib

from bandgate.ops.local_broker import free_port


class CuttableProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._cut = False

    async def start(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        """Drop every connection now, and refuse new ones until `restore()`."""
        self._cut = True
        for writer in list(self._writers):
            transport = writer.transport
            transport.abort()
        self._writers.clear()

    def restore(self) -> None:
        self._cut = False

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

"""A runner's lifetime: whether it is stopping, and the background work that ends with it.

Every part of a runner reads the one `Lifetime` instead of keeping a flag of its own, so
"stopping" means the same thing to the way in, the probes, the handovers and the pipeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


class Lifetime:
    def __init__(self) -> None:
        self._stopping = False
        self._stopped = asyncio.Event()  # ends the waits of `pause`
        self._background: set[asyncio.Future[None]] = set()  # probes, handovers, sharing

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        self._stopping = True
        self._stopped.set()

    async def pause(self, seconds: float) -> bool:
        """Sleep; False when the runner starts stopping meanwhile (or had already)."""
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
        except TimeoutError:
            return True
        return False

    def spawn(self, work: Awaitable[None]) -> None:
        """Run `work` in the background until it ends or `cancel_background()`."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


__all__ = ["Lifetime"]

"""`SyncProducer`: the `Producer` for code without an event loop (scripts, WSGI apps, task
queues), safe to share between threads.

aio-pika binds a connection to the event loop it was opened on, and none of its objects may be
touched from another thread. So the producer lives on an event loop in a thread of its own:
each call hands its coroutine to that loop (`asyncio.run_coroutine_threadsafe`) and blocks on
the returned future, which waits on a lock rather than polling. Publishes from many threads run
there as concurrent tasks and share the connection and its confirm channels; each ends within
the confirm timeout, so no call blocks for longer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from bandgate.core.producer import BatchMessage, BatchResult, Producer
from bandgate.core.publish_outcomes import BrokerUnavailable, Published
from bandgate.core.telemetry import Telemetry
from bandgate.topology import naming
from bandgate.topology.model import Topology
from bandgate.topology.wire import HeaderValue

T = TypeVar("T")

_Started = tuple[asyncio.AbstractEventLoop, Producer, asyncio.Event]


class SyncProducer:
    """`Producer`'s methods as blocking calls, with the same results and exceptions."""

    def __init__(self, opening: Awaitable[Producer]) -> None:
        """Start the producer's thread and open it there (`connect` says how)."""
        self._lock = threading.Lock()
        self._calls: set[concurrent.futures.Future[Any]] = set()
        self._closed = False
        started: concurrent.futures.Future[_Started] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=asyncio.run,
            args=(self._serve(opening, started),),
            name="bandgate-producer",
            daemon=True,  # a producer left open must not keep the process from exiting
        )
        self._thread.start()
        try:
            self._loop, self._producer, self._stop = started.result()
        except BaseException:
            self._thread.join()
            raise

    @classmethod
    def connect(
        cls,
        url: str | None = None,
        *,
        topology: Topology | str | os.PathLike[str] | None = None,
        confirm_timeout: float = 5.0,
        declare_topology: bool = False,
        channel_pool_size: int = 2,
        connect_timeout: float = 10.0,
        connection_name: str = naming.PRODUCER_CONNECTION,
        telemetry: Telemetry | None = None,
        max_body_bytes: int | None = None,
    ) -> SyncProducer:
        """Connect as `Producer.connect` does, and return once connected; use `with` to close
        it on exit."""
        return cls(
            Producer.connect(
                url,
                topology=topology,
                confirm_timeout=confirm_timeout,
                declare_topology=declare_topology,
                channel_pool_size=channel_pool_size,
                connect_timeout=connect_timeout,
                connection_name=connection_name,
                telemetry=telemetry,
                max_body_bytes=max_body_bytes,
            )
        )

    def publish(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | str | None = None,
        delay: float | None = None,
        deliver_at: datetime | None = None,
        headers: Mapping[str, HeaderValue] | None = None,
        message_id: str | None = None,
        partition_key: str | None = None,
        tenant: str | None = None,
    ) -> Published:
        """`Producer.publish`, blocking until the broker confirmed or the publish failed."""
        return self._call(
            lambda: self._producer.publish(
                queue,
                payload,
                priority=priority,
                delay=delay,
                deliver_at=deliver_at,
                headers=headers,
                message_id=message_id,
                partition_key=partition_key,
                tenant=tenant,
            )
        )

    def publish_batch(self, queue: str, messages: Iterable[BatchMessage]) -> BatchResult:
        """`Producer.publish_batch`, blocking until every message is settled."""
        batch = list(messages)  # read here: the caller's iterable belongs to the caller's thread
        return self._call(lambda: self._producer.publish_batch(queue, batch))

    def close(self) -> None:
        """Refuse new calls, let those under way finish, then close the producer and stop
        its thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            under_way = list(self._calls)
        concurrent.futures.wait(under_way)
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, call: Callable[[], Coroutine[Any, Any, T]]) -> T:
        # The lock orders every submission before close() looks at the calls under way.
        with self._lock:
            if self._closed:
                raise BrokerUnavailable("the producer is closed")
            future = asyncio.run_coroutine_threadsafe(call(), self._loop)
            self._calls.add(future)
        future.add_done_callback(self._forget)
        return future.result()

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._calls.discard(future)

    @staticmethod
    async def _serve(
        opening: Awaitable[Producer], started: concurrent.futures.Future[_Started]
    ) -> None:
        """The thread's loop: open the producer, hand it over, serve until `close`."""
        try:
            producer = await opening
        except BaseException as exc:  # handed to the thread waiting in __init__
            started.set_exception(exc)
            return
        stop = asyncio.Event()
        started.set_result((asyncio.get_running_loop(), producer, stop))
        try:
            await stop.wait()
        finally:
            await producer.close()

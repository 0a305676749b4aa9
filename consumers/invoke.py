"""Running one handler on one message: async on the loop, sync in a thread, under a time limit.

Shared by the worker and the testing helper, so a handler test sees the same time limit and
threading as production.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from bandgate.consumers.errors import TimeLimitExceeded
from bandgate.consumers.message import Message

log = logging.getLogger(__name__)

Handler = Callable[[Message], Any]


def is_async(handler: Handler) -> bool:
    """Whether calling `handler` returns an awaitable (coroutine functions, partials of them,
    objects with an async `__call__`)."""
    target: Any = handler
    while isinstance(target, functools.partial):
        target = target.func
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - an async __call__ is what we look for
    )


async def invoke(
    handler: Handler,
    message: Message,
    *,
    time_limit: float | None = None,
    executor: Executor | None = None,
    asynchronous: bool | None = None,
) -> None:
    """Run `handler(message)`; `TimeLimitExceeded` when it runs past `time_limit` seconds.

    An async handler is cancelled at the limit. A sync one runs in `executor`'s threads, which
    Python cannot interrupt: at the limit it counts as failed and its slot is freed, but the
    thread runs on until the function returns (logged, so it can be found). A TimeoutError the
    handler raises itself (say, from an HTTP client) stays a TimeoutError. `asynchronous` is
    `is_async(handler)`, when the caller knows it already (it runs on every message).
    """
    if asynchronous is None:
        asynchronous = is_async(handler)
    if time_limit is None:
        await _call(handler, message, asynchronous, executor)
        return
    scope = asyncio.timeout(time_limit)
    try:
        async with scope:
            await _call(handler, message, asynchronous, executor)
    except TimeoutError:
        if not scope.expired():
            raise
        if not asynchronous:
            log.warning(
                "sync handler %s ran past its time limit of %g s on message %s; its thread "
                "cannot be interrupted and keeps running",
                getattr(handler, "__qualname__", repr(handler)),
                time_limit,
                message.message_id,
            )
        raise TimeLimitExceeded(
            f"handler ran past its time limit of {time_limit:g} s and was cancelled"
        ) from None


async def _call(
    handler: Handler, message: Message, asynchronous: bool, executor: Executor | None
) -> None:
    if asynchronous:
        await handler(message)
    else:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # keeps the trace span in the thread
        await loop.run_in_executor(executor, context.run, handler, message)

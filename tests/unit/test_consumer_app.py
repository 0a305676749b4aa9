from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import bandgate.consumers
from bandgate.consumers import ConsumerApp, Message, Reject, Retry
from bandgate.consumers.consumer import is_async
from bandgate.consumers.decision import invoke
from bandgate.consumers.errors import ConfigurationError, TimeLimitExceeded
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.testing import Ack, DeadLetter, RetryLater, deliver, make_message
from bandgate.topology.loader import TopologyError
from bandgate.topology.model import Topology


@pytest.fixture
def app(topology: Topology) -> ConsumerApp:
    return ConsumerApp(WorkerSettings(), topology=topology)


def test_the_package_exports_the_documented_names() -> None:
    exported = bandgate.consumers.__all__
    assert {"ConsumerApp", "Message", "Reject", "Requeue", "Retry"} <= set(exported)
    assert exported == sorted(exported, key=lambda name: (not name.isupper(), name))
    documented = bandgate.consumers.__doc__ or ""
    assert [name for name in exported if f"`{name}`" not in documented] == []


def test_the_decorated_function_stays_a_plain_function(app: ConsumerApp) -> None:
    def handle(msg: Message) -> str:
        return f"handled {msg.payload}"

    decorated = app.consumer("orders", concurrency=3, policy="weighted", time_limit=2)(handle)
    assert decorated is handle
    assert handle(make_message("x")) == "handled x"
    consumer = app.consumer_for("orders")
    assert consumer.options.concurrency == 3
    assert consumer.options.policy == "weighted"
    assert consumer.options.time_limit == 2.0
    assert not consumer.is_async
    assert consumer.name.endswith("handle")


def test_retry_options_override_the_queue_policy(app: ConsumerApp) -> None:
    @app.consumer("emails", max_attempts=2, max_deliveries=9)
    async def handle(msg: Message) -> None: ...

    retry = app.consumer_for("emails").options.retry
    assert (retry.max_attempts, retry.max_deliveries) == (2, 9)
    assert retry.backoff_initial_seconds == 1.0  # the rest stays the topology's


def test_prefetch_defaults_follow_the_concurrency_and_accept_overrides(app: ConsumerApp) -> None:
    @app.consumer("orders", concurrency=4, prefetch={"cold": 5})
    async def handle(msg: Message) -> None: ...

    consumer = app.consumer_for("orders")
    assert consumer.options.prefetch(consumer.spec) == (8, 8, 5)
    assert consumer.options.prefetch(consumer.spec, concurrency=10) == (20, 20, 5)


@pytest.mark.parametrize(
    ("queue", "options", "message"),
    [
        ("ordrs", {}, "the topology has no queue 'ordrs' (queues: emails, orders)"),
        ("orders", {"concurrency": 0}, "concurrency must be an integer >= 1, not 0"),
        ("orders", {"concurrency": True}, "concurrency must be an integer >= 1"),
        ("orders", {"policy": "fair"}, "policy must be one of strict, weighted, not 'fair'"),
        ("orders", {"time_limit": 0}, "time_limit must be seconds > 0"),
        ("orders", {"max_attempts": 0}, "max_attempts Input should be greater than or equal to 1"),
        ("orders", {"max_deliveries": "3"}, "max_deliveries must be an integer"),
        ("orders", {"prefetch": {"tepid": 3}}, "prefetch names band 'tepid'"),
        ("orders", {"prefetch": {"hot": 0}}, "prefetch of band 'hot' must be >= 1"),
        ("orders", {"prefetch": [1, 2]}, "prefetch must map band names to counts"),
        ("orders", {"hot_reserve": -1}, "hot_reserve must be an integer from 0 to"),
        ("orders", {"concurrency": 4, "hot_reserve": 4}, "concurrency - 1 (3), not 4"),
        ("orders", {"hot_reserve": 1.5}, "hot_reserve must be an integer"),
    ],
)
def test_bad_options_fail_when_the_decorator_runs(
    app: ConsumerApp, queue: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        app.consumer(queue, **options)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"@consumer({queue!r}): ")


def test_a_misspelt_option_fails_at_import(app: ConsumerApp) -> None:
    options: dict[str, Any] = {"concurency": 8}
    with pytest.raises(TypeError, match="concurency"):
        app.consumer("orders", **options)


def test_one_handler_per_queue(app: ConsumerApp) -> None:
    @app.consumer("orders")
    async def first(msg: Message) -> None: ...

    with pytest.raises(ConfigurationError, match="already has a handler"):

        @app.consumer("orders")
        async def second(msg: Message) -> None: ...


def test_the_topology_is_read_from_the_settings_on_first_use(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    app = ConsumerApp(WorkerSettings(topology=missing))  # nothing is read yet
    with pytest.raises(TopologyError, match="topology file not found"):
        app.consumer("orders")


def test_async_detection() -> None:
    async def coroutine(msg: Message) -> None: ...

    class Callable:
        async def __call__(self, msg: Message) -> None: ...

    assert is_async(coroutine)
    assert is_async(Callable())
    assert not is_async(lambda msg: None)


async def test_a_sync_handler_runs_in_a_thread() -> None:
    threads: list[threading.Thread] = []
    await invoke(lambda msg: threads.append(threading.current_thread()), make_message())
    assert threads
    assert threads[0] is not threading.main_thread()


async def test_an_async_handler_past_its_time_limit_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def slow(msg: Message) -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeLimitExceeded, match="time limit of 0.05 s"):
        await invoke(slow, make_message(), time_limit=0.05)
    assert cancelled.is_set()


async def test_a_timeout_of_the_handler_itself_is_not_the_time_limit() -> None:
    async def times_out(msg: Message) -> None:
        raise TimeoutError("upstream")

    with pytest.raises(TimeoutError, match="upstream"):
        await invoke(times_out, make_message(), time_limit=5)


async def test_deliver_reports_what_the_worker_would_do(app: ConsumerApp) -> None:
    @app.consumer("orders", max_attempts=3)
    async def handle(msg: Message) -> None:
        if msg.payload == "retry":
            raise Retry(delay=1.5)
        if msg.payload == "reject":
            raise Reject("bad order")
        if msg.payload == "fail":
            raise ValueError("boom")

    assert await deliver(app, make_message("ok")) == Ack()
    assert await deliver(app, make_message("retry")) == RetryLater(1.5, 2, "Retry: retry requested")
    rejected = await deliver(app, make_message("reject"))
    assert isinstance(rejected, DeadLetter)
    assert rejected.cause == "rejected"
    last = await deliver(app, make_message("fail", attempt=3))
    assert isinstance(last, DeadLetter)
    assert last.cause == "max-attempts"
    crash_looped = await deliver(app, make_message("ok", delivery_count=5))
    assert isinstance(crash_looped, DeadLetter)
    assert crash_looped.cause == "delivery-limit"


async def test_deliver_needs_a_consumer_for_the_queue(app: ConsumerApp) -> None:
    with pytest.raises(ConfigurationError, match="no consumer for queue 'emails'"):
        await deliver(app, make_message(queue="emails"))


def test_make_message_follows_the_topology_bands(topology: Topology) -> None:
    assert make_message(queue="emails", priority=5, topology=topology).band == "hot"
    promoted = make_message(priority=2, band="warm")
    assert promoted.band == "warm"
    assert promoted.promoted

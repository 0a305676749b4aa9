from __future__ import annotations

import asyncio
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from bandgate.consumers.app import ConsumerApp
from bandgate.consumers.worker import Worker
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import Topology
from tests.broker import TestBroker, session_broker

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestBroker]:
    with session_broker(tmp_path_factory.mktemp("broker")) as test_broker:
        yield test_broker


@pytest.fixture
def amqp_url(broker: TestBroker) -> Iterator[str]:
    """An AMQP URL for a vhost created for this test alone."""
    with broker.fresh_vhost() as vhost:
        yield broker.vhost_url(vhost)


@pytest.fixture
def topology() -> Topology:
    """The shipped topology's shape, with a shorter delay ladder to keep declares quick."""
    return parse_topology(
        {
            "exchange": "bandgate",
            "delay": {"base_ms": 50, "levels": 12},
            "queues": {
                "orders": {},
                "emails": {
                    "bands": [
                        {"name": "hot", "priorities": [5, 9]},
                        {"name": "cold", "priorities": [0, 4], "type": "classic"},
                    ]
                },
            },
        }
    )


@pytest.fixture
async def start_worker() -> AsyncIterator[Callable[[ConsumerApp], Awaitable[Worker]]]:
    """Start an in-process consumer worker for an app; each one is stopped after the test."""
    started: list[tuple[Worker, asyncio.Task[None]]] = []

    async def start(app: ConsumerApp) -> Worker:
        worker = Worker(app)
        task = asyncio.create_task(worker.run())
        ready = asyncio.create_task(worker.ready.wait())
        done, _ = await asyncio.wait({task, ready}, timeout=30, return_when=FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            if task in done:
                task.result()  # it failed to start: show why
            task.cancel()
            raise TimeoutError("the worker was not ready within 30 s")
        started.append((worker, task))
        return worker

    yield start
    for worker, task in started:
        worker.stop()
        await asyncio.wait_for(task, 30)

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker import TestBroker, session_broker
from topology.loader import parse_topology
from topology.model import Topology

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

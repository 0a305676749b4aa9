from __future__ import annotations

import pytest

from bandgate.topology import naming


def test_band_and_dead_letter_names() -> None:
    assert naming.band_queue("orders", "hot") == "orders.hot"
    assert naming.dead_letter_queue("orders") == "orders.dlq"
    assert naming.dead_letter_exchange("bandgate") == "bandgate.dead"


def test_routing_keys() -> None:
    assert naming.routing_key("orders", 8) == "orders.8"
    assert naming.delayed_routing_key("0.1.1", "orders", 8) == "0.1.1.orders.8"
    assert naming.delay_exit_pattern("orders", 8) == "#.orders.8"


def test_delay_names_group_under_one_prefix_and_sort_by_level() -> None:
    names = [naming.delay_level("bandgate", level) for level in range(48)]
    assert names[0] == "bandgate.delay.00"
    assert names[32] == "bandgate.delay.32"
    assert sorted(names) == names
    assert naming.delay_exit_exchange("bandgate") == "bandgate.delay.out"
    assert all(name.startswith("bandgate.delay.") for name in [*names, "bandgate.delay.out"])


def test_connection_names_say_the_role() -> None:
    assert naming.GATEWAY_CONNECTION == "bandgate-gateway"
    assert naming.WORKER_CONNECTION == "bandgate-worker"
    assert naming.CLI_CONNECTION == "bandgate-cli"


@pytest.mark.parametrize("name", ["orders", "a", "9lives", "bulk_email", "eu-west-1", "x" * 64])
def test_valid_names(name: str) -> None:
    assert naming.is_valid_name(name)


@pytest.mark.parametrize(
    "name",
    ["", "orders.hot", "a b", "-orders", "_orders", "x" * 65, "ordérs", "orders#", "a*", "a\n"],
)
def test_invalid_names(name: str) -> None:
    """No dots, '*' or '#': the last two words of a routing key are always queue.priority."""
    assert not naming.is_valid_name(name)


def test_shard_names() -> None:
    assert naming.shard_queue("orders", "cold", 0) == "orders.cold.0"
    assert naming.shard_exchange("bandgate", "orders", "cold") == "bandgate.shards.orders.cold"
    assert naming.workers_queue("bandgate", "orders") == "bandgate.workers.orders"
    # A queue named `delay` with a band `out` cannot take the delay exit's name.
    assert naming.shard_exchange("bandgate", "delay", "out") != naming.delay_exit_exchange(
        "bandgate"
    )

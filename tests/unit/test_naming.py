from __future__ import annotations

import pytest
from pamqp import constants

from bandgate.topology import naming
from bandgate.topology.loader import parse_topology
from bandgate.topology.objects import plan


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
    assert names[0] == "zz.bandgate.delay.00"
    assert names[25] == "zz.bandgate.delay.25"
    assert sorted(names) == names
    assert naming.delay_exit_exchange("bandgate") == "zz.bandgate.delay.out"
    assert all(name.startswith("zz.bandgate.delay.") for name in [*names, "zz.bandgate.delay.out"])


def test_internal_queues_sort_after_the_bands_in_byte_order() -> None:
    """The management UI lists queues by name, byte by byte; a band's name starts with its
    queue's, which starts with [A-Za-z0-9]. Only a queue named `zz...` may sort after."""
    internal = [naming.delay_level("a", 0).encode(), naming.workers_queue("0", "a").encode()]
    bands = [naming.shard_queue("zy" + "z" * 62, "z" * 64, 99).encode(), b"Z" * 64, b"9"]
    assert max(bands) < min(internal)


def test_every_planned_name_is_a_valid_amqp_name() -> None:
    """pamqp, under aio-pika, refuses names outside AMQP 0-9-1's characters (a `~`, say)."""
    topology = parse_topology(
        {
            "queues": {
                "orders": {
                    "ordered": True,
                    "bands": [{"name": "all", "priorities": [0, 9], "shards": 2}],
                }
            }
        }
    )
    objects = plan(topology)
    names = [e.name for e in objects.exchanges] + [q.name for q in objects.queues]
    assert naming.workers_queue(topology.exchange, "orders") in names
    for name in names:
        assert constants.DOMAIN_REGEX["queue-name"].fullmatch(name), name
        assert constants.DOMAIN_REGEX["exchange-name"].fullmatch(name), name


def test_the_legacy_rule_is_the_name_without_the_internal_prefix() -> None:
    assert naming.legacy_delay_level("bandgate", 7) == "bandgate.delay.07"
    assert naming.legacy_delay_exit_exchange("bandgate") == "bandgate.delay.out"
    assert naming.legacy_workers_queue("bandgate", "orders") == "bandgate.workers.orders"
    assert naming.delay_level("bandgate", 7) == naming.INTERNAL_PREFIX + "bandgate.delay.07"


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
    assert naming.workers_queue("bandgate", "orders") == "zz.bandgate.workers.orders"
    # A queue named `delay` with a band `out` cannot take the delay exit's name.
    assert naming.shard_exchange("bandgate", "delay", "out") != naming.delay_exit_exchange(
        "bandgate"
    )

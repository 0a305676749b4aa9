"""Finding what an older bandgate declared under the legacy names, and what the doctor says."""

from __future__ import annotations

from bandgate.topology import legacy, naming
from bandgate.topology.loader import parse_topology
from bandgate.topology.model import MAX_DELAY_LEVELS
from bandgate.topology.objects import plan

TOPOLOGY = parse_topology(
    {
        "delay": {"levels": 4},
        "queues": {
            # Ordered and sharded: the only kind of queue that had a workers queue.
            "orders": {
                "ordered": True,
                "bands": [{"name": "all", "priorities": [0, 9], "shards": 2}],
            },
            "emails": {},
            # A band queue that happens to take an old level's name stays the band's.
            "bandgate": {"bands": [{"name": "delay", "priorities": [0, 9], "shards": 11}]},
        },
    }
)


def test_legacy_names_are_every_possible_old_level_top_first_but_never_a_planned_name() -> None:
    names = legacy.legacy_queues(TOPOLOGY)
    levels = [name for name, role in names.items() if role == "delay"]
    assert levels[0] == "bandgate.delay.47"
    assert levels[-1] == "bandgate.delay.00"
    assert "bandgate.delay.10" not in names  # shard 10 of the band `bandgate.delay`
    assert len(levels) == MAX_DELAY_LEVELS - 1
    assert names["bandgate.workers.orders"] == "workers"
    assert "bandgate.workers.emails" not in names
    planned = {q.name for q in plan(TOPOLOGY).queues}
    assert not planned & set(names)
    exchanges = legacy.legacy_exchanges(TOPOLOGY)
    assert exchanges[0] == "bandgate.delay.00"
    assert exchanges[-1] == "bandgate.delay.out"  # after the levels that lead to it


def test_the_management_listing_gives_the_old_ladder_and_its_messages() -> None:
    queues = [
        {"name": naming.legacy_delay_level("bandgate", k), "messages": k, "consumers": 0}
        for k in range(3)
    ]
    queues += [{"name": naming.delay_level("bandgate", 0), "messages": 9}, {"name": "emails.hot"}]
    queues.append({"name": "bandgate.workers.orders", "consumers": 2})
    exchanges = [{"name": "bandgate.delay.out"}, {"name": "bandgate.delay.00"}, {"name": "x"}]
    found = legacy.from_management(TOPOLOGY, queues, exchanges)
    assert [q.name for q in found.queues] == [
        "bandgate.delay.02",
        "bandgate.delay.01",
        "bandgate.delay.00",
        "bandgate.workers.orders",
    ]
    assert found.delayed == 3
    assert found.exchanges == ("bandgate.delay.00", "bandgate.delay.out")

    ladder, workers = legacy.findings(found)
    assert (ladder.code, ladder.severity, ladder.subject) == (
        "legacy_delay_ladder",
        "warning",
        "old delay ladder",
    )
    assert ladder.message.startswith("bandgate.delay.00 .. bandgate.delay.02 (3 levels")
    assert "still holds 3 message(s)" in ladder.message
    assert "`bandgate topology prune`" in ladder.message
    assert workers.subject == "bandgate.workers.orders"
    assert "(2 consumer(s))" in workers.message


def test_an_empty_old_ladder_is_to_be_removed_and_nothing_left_says_nothing() -> None:
    empty = legacy.Leftovers((legacy.LegacyQueue("bandgate.delay.00", "delay", 0, 0),), ())
    (finding,) = legacy.findings(empty)
    assert "is empty: remove it with `bandgate topology prune`" in finding.message
    exchanges_only = legacy.Leftovers((), ("bandgate.delay.out",))
    (finding,) = legacy.findings(exchanges_only)
    assert "exchanges of an older bandgate's delay ladder remain (bandgate.delay.out)" in (
        finding.message
    )
    assert legacy.findings(legacy.Leftovers((), ())) == []
    assert not legacy.Leftovers((), ())

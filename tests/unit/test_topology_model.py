"""The topology model and its loader: valid files load, invalid ones say file, queue and band."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bandgate.topology.loader import TOPOLOGY_ENV, TopologyError, load_topology, parse_topology
from bandgate.topology.model import Band, QueueSpec, RetryPolicy, Topology, UnknownQueueError

ROOT = Path(__file__).resolve().parents[2]

ORDERS_HEADER = 'exchange = "bandgate"\n\n[queues.orders]\n'


def band(name: str, low: int, high: int, extra: str = "") -> str:
    return f'[[queues.orders.bands]]\nname = "{name}"\npriorities = [{low}, {high}]\n{extra}\n'


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as caught:
        load_topology(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    return message


def test_the_shipped_topology_loads() -> None:
    topology = load_topology(ROOT / "bandgate.toml")
    assert topology.exchange == "bandgate"
    assert list(topology.queues) == ["orders", "emails"]
    orders = topology.queue("orders")
    assert [(b.name, b.priorities, b.type) for b in orders.bands] == [
        ("hot", (7, 9), "quorum"),
        ("warm", (4, 6), "quorum"),
        ("cold", (0, 3), "quorum"),
    ]
    assert orders.band("warm").age_after_seconds == 600
    assert topology.queue("emails").band("cold").type == "classic"
    assert topology.queue("emails").retry.max_attempts == 8


def test_a_queue_without_bands_gets_hot_warm_cold(tmp_path: Path) -> None:
    topology = load_topology(write(tmp_path, ORDERS_HEADER))
    orders = topology.queue("orders")
    assert [(b.name, b.low, b.high) for b in orders.bands] == [
        ("hot", 7, 9),
        ("warm", 4, 6),
        ("cold", 0, 3),
    ]
    assert orders.retry == RetryPolicy()
    assert topology.delay.base_ms == 50


def test_the_path_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, ORDERS_HEADER)
    monkeypatch.setenv(TOPOLOGY_ENV, str(path))
    assert list(load_topology().queues) == ["orders"]


def test_ten_one_level_bands_are_allowed() -> None:
    bands = [{"name": f"p{level}", "priorities": [level, level]} for level in range(9, -1, -1)]
    spec = parse_topology({"queues": {"q": {"bands": bands}}}).queue("q")
    assert [spec.band_for(level).name for level in range(10)] == [f"p{n}" for n in range(10)]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="missing.toml: topology file not found"):
        load_topology(tmp_path / "missing.toml")


def test_invalid_toml_is_named(tmp_path: Path) -> None:
    message = load_error(tmp_path, "[queues.orders\n")
    assert "invalid TOML" in message


def test_a_queue_defined_twice_is_invalid_toml(tmp_path: Path) -> None:
    message = load_error(tmp_path, ORDERS_HEADER + "[queues.orders]\n")
    assert "invalid TOML" in message


@pytest.mark.parametrize(
    ("bands", "expected"),
    [
        pytest.param(
            band("hot", 6, 9) + band("cold", 0, 6),
            "queue 'orders': band 'cold' (0-6) overlaps the band above it; "
            "list bands hottest first with disjoint priority ranges",
            id="overlapping",
        ),
        pytest.param(
            band("hot", 7, 9) + band("cold", 0, 5),
            "queue 'orders': no band covers priority 6 (gap above band 'cold'); "
            "bands must cover 0-9 without gaps",
            id="gapped",
        ),
        pytest.param(
            band("hot", 5, 8) + band("cold", 0, 4),
            "queue 'orders': no band covers priority 9 (gap above band 'hot')",
            id="gap-at-the-top",
        ),
        pytest.param(
            band("hot", 7, 9) + band("cold", 2, 6),
            "queue 'orders': no band covers priorities 0-1; bands must cover 0-9",
            id="gap-at-the-bottom",
        ),
        pytest.param(
            band("cold", 0, 3) + band("warm", 4, 6) + band("hot", 7, 9),
            "queue 'orders': band 'warm' (4-6) is listed after band 'cold' (0-3); "
            "list bands hottest first",
            id="not-hottest-first",
        ),
        pytest.param(
            band("hot", 5, 9) + band("hot", 0, 4),
            "queue 'orders': band names repeat: hot",
            id="duplicate-band-names",
        ),
        pytest.param(
            band("dlq", 0, 9),
            "queue 'orders': 'dlq' is reserved for the dead-letter queue",
            id="reserved-band-name",
        ),
        pytest.param(
            band("hot.1", 5, 9) + band("cold", 0, 4),
            "queue 'orders', band 'hot.1', field 'name': band name 'hot.1' is invalid: "
            "1-64 characters: letters, digits, '-' and '_'",
            id="bad-band-name",
        ),
        pytest.param(
            band("hot", 5, 9) + band("cold", 0, 4, 'type = "stream"'),
            "queue 'orders', band 'cold', field 'type': Input should be 'quorum' or 'classic'",
            id="bad-type",
        ),
        pytest.param(
            band("hot", 5, 9, "age_after_seconds = 60") + band("cold", 0, 4),
            "queue 'orders': band 'hot' is the hottest: there is no band to age into",
            id="aging-on-the-hottest-band",
        ),
        pytest.param(
            band("hot", 5, 9) + band("cold", 0, 4, "age_after_seconds = 0"),
            "queue 'orders', band 'cold', field 'age_after_seconds': "
            "Input should be greater than 0",
            id="aging-not-positive",
        ),
        pytest.param(
            band("hot", 5, 10) + band("cold", 0, 4),
            "queue 'orders', band 'hot', field 'priorities': priority 10 is out of range 0-9",
            id="priority-out-of-range",
        ),
        pytest.param(
            band("hot", 9, 5) + band("cold", 0, 4),
            "queue 'orders', band 'hot', field 'priorities': "
            "priorities [9, 5] must be [lowest, highest]",
            id="range-reversed",
        ),
        pytest.param(
            band("hot", 5, 9, 'colour = "red"') + band("cold", 0, 4),
            "queue 'orders', band 'hot', field 'colour': Extra inputs are not permitted",
            id="extra-band-key",
        ),
    ],
)
def test_invalid_bands_name_file_queue_and_band(tmp_path: Path, bands: str, expected: str) -> None:
    message = load_error(tmp_path, ORDERS_HEADER + bands)
    assert expected in message


def test_every_problem_is_reported_on_its_own_line(tmp_path: Path) -> None:
    text = ORDERS_HEADER + band("hot", 5, 9, 'type = "x"') + band("cold", 0, 4, 'type = "y"')
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as caught:
        load_topology(path)
    assert str(caught.value).splitlines() == [
        f"{path}: queue 'orders', band 'hot', field 'type': Input should be 'quorum' or 'classic'",
        f"{path}: queue 'orders', band 'cold', field 'type': Input should be 'quorum' or 'classic'",
    ]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            {"queues": {"ord ers": {}}},
            "queue 'ord ers', field 'name': queue name 'ord ers' is invalid",
            id="bad-queue-name",
        ),
        pytest.param(
            {"queues": {"orders": {"retries": 5}}},
            "queue 'orders', field 'retries': Extra inputs are not permitted",
            id="extra-queue-key",
        ),
        pytest.param(
            {"exchnage": "bandgate"},
            "field 'exchnage': Extra inputs are not permitted",
            id="extra-top-level-key",
        ),
        pytest.param(
            {"exchange": "band.gate"},
            "field 'exchange': exchange name 'band.gate' is invalid",
            id="bad-exchange-name",
        ),
        pytest.param(
            {"queues": {"orders": {"retry": {"max_attempts": 0}}}},
            "queue 'orders', field 'retry.max_attempts': Input should be greater than or equal "
            "to 1",
            id="bad-retry",
        ),
        pytest.param(
            {"queues": {"orders": {"bands": []}}},
            "queue 'orders': a queue needs at least one band",
            id="no-bands",
        ),
        pytest.param(
            {"queues": {"orders": {"name": "other"}}},
            "queue 'orders' has a different name 'other'",
            id="name-differs-from-key",
        ),
        pytest.param(
            {"delay": {"levels": 0}},
            "field 'delay.levels': Input should be greater than or equal to 1",
            id="bad-delay",
        ),
    ],
)
def test_parse_topology_names_the_source(data: dict[str, object], expected: str) -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology(data, source="inline.toml")
    assert str(caught.value).startswith("inline.toml: ")
    assert expected in str(caught.value)


def test_band_lookup_and_the_band_above() -> None:
    orders = QueueSpec(name="orders")
    assert [orders.band_for(p).name for p in range(10)] == ["cold"] * 4 + ["warm"] * 3 + ["hot"] * 3
    assert orders.band_above(orders.band("cold")) == orders.band("warm")
    assert orders.band_above(orders.band("hot")) is None
    with pytest.raises(KeyError, match="no band 'tepid'"):
        orders.band("tepid")


def test_weights_double_per_band_unless_given() -> None:
    assert QueueSpec(name="orders").weights() == (4.0, 2.0, 1.0)
    spec = QueueSpec(
        name="q",
        bands=(Band(name="a", priorities=(5, 9), weight=3), Band(name="b", priorities=(0, 4))),
    )
    assert spec.weights() == (3.0, 1.0)


def test_backoff_grows_and_is_capped() -> None:
    retry = RetryPolicy(backoff_initial_seconds=1, backoff_multiplier=2, backoff_max_seconds=5)
    assert [retry.backoff_seconds(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]


def test_unknown_queue() -> None:
    topology = Topology()
    with pytest.raises(UnknownQueueError) as caught:
        topology.queue("nope")
    assert str(caught.value) == "unknown queue 'nope'"


def test_the_model_is_frozen() -> None:
    spec = QueueSpec(name="orders")
    with pytest.raises(ValidationError):
        spec.name = "other"


def test_shards_ordered_and_failure_strategy_load(tmp_path: Path) -> None:
    text = (
        ORDERS_HEADER
        + 'ordered = true\nfailure_strategy = "skip"\n'
        + band("hot", 5, 9)
        + band("cold", 0, 4, "shards = 4")
    )
    orders = load_topology(write(tmp_path, text)).queue("orders")
    assert orders.ordered
    assert not orders.ordering_required
    assert orders.failure_strategy == "skip"
    assert [b.shards for b in orders.bands] == [1, 4]
    assert orders.band_queues(orders.band("hot")) == ("orders.hot",)
    assert orders.band_queues(orders.band("cold")) == tuple(f"orders.cold.{i}" for i in range(4))
    assert orders.shares_shards


def test_ordered_queues_block_and_dead_letter_by_default() -> None:
    spec = QueueSpec(name="orders", ordered=True)
    assert spec.failure_strategy is None
    assert spec.effective_failure_strategy == "block_and_dlq"
    assert not spec.shares_shards  # no band is sharded: nothing to share out


def test_a_strictly_serial_queue_is_ordered_with_one_band_of_one_shard() -> None:
    spec = QueueSpec.model_validate({"name": "commands", "ordering_required": True})
    assert spec.ordered
    assert [(b.name, b.priorities, b.shards) for b in spec.bands] == [("all", (0, 9), 1)]
    assert spec.band_queues(spec.bands[0]) == ("commands.all",)
    named = QueueSpec.model_validate(
        {
            "name": "commands",
            "ordering_required": True,
            "failure_strategy": "block",
            "bands": [{"name": "serial", "priorities": [0, 9]}],
        }
    )
    assert named.bands[0].name == "serial"
    assert named.failure_strategy == "block"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        pytest.param(
            'failure_strategy = "block"\n',
            "queue 'orders': failure_strategy applies to ordered queues only",
            id="strategy-without-ordered",
        ),
        pytest.param(
            'ordered = true\nfailure_strategy = "retry"\n',
            "queue 'orders', field 'failure_strategy': "
            "Input should be 'skip', 'block' or 'block_and_dlq'",
            id="unknown-strategy",
        ),
        pytest.param(
            'ordering_required = true\nfailure_strategy = "skip"\n',
            "queue 'orders': failure_strategy 'skip' is refused with ordering_required: a "
            "skipped message lets later ones overtake it; use 'block' or 'block_and_dlq'",
            id="serial-skip",
        ),
        pytest.param(
            "ordering_required = true\nordered = false\n",
            "queue 'orders': ordering_required implies ordered",
            id="serial-not-ordered",
        ),
        pytest.param(
            "ordering_required = true\n" + band("hot", 5, 9) + band("cold", 0, 4),
            "queue 'orders': ordering_required handles every message in publish order, so the "
            "queue has one band covering priorities 0-9 (priorities would reorder it), not 2 "
            "('hot', 'cold'); leave bands out to get one named 'all'",
            id="serial-with-bands",
        ),
        pytest.param(
            "ordering_required = true\n" + band("all", 0, 9, "shards = 3"),
            "queue 'orders': band 'all' has shards = 3, but ordering_required means one queue "
            "with one active consumer",
            id="serial-sharded",
        ),
        pytest.param(
            band("hot", 5, 9) + band("cold", 0, 4, "shards = 0"),
            "queue 'orders', band 'cold', field 'shards': Input should be greater than or equal "
            "to 1",
            id="no-shards",
        ),
        pytest.param(
            band("hot", 5, 9) + band("cold", 0, 4, "shards = 65"),
            "queue 'orders', band 'cold', field 'shards': Input should be less than or equal to 64",
            id="too-many-shards",
        ),
    ],
)
def test_invalid_ordering_names_file_queue_and_band(
    tmp_path: Path, settings: str, expected: str
) -> None:
    message = load_error(tmp_path, ORDERS_HEADER + settings)
    assert expected in message, message


def test_a_topology_survives_a_round_trip_through_its_dump() -> None:
    topology = parse_topology(
        {
            "queues": {
                "orders": {"ordered": True, "failure_strategy": "skip"},
                "emails": {"bands": [{"name": "all", "priorities": [0, 9], "shards": 3}]},
                "commands": {"ordering_required": True},
            }
        }
    )
    assert Topology.model_validate(topology.model_dump()) == topology

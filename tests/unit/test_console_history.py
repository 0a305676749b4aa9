"""The console's wait per band: which figure is shown, and its percentiles over the window."""

from __future__ import annotations

import pytest

from bandgate.gateway.console_history import (
    BandPoint,
    QueueHistory,
    Wait,
    band_wait,
    management_rates,
    percentile,
)


def point(
    ready: int | None, head_age: float | None = None, deliver_rate: float | None = None
) -> BandPoint:
    return BandPoint(ready, 0, 1, head_age, 0.0, deliver_rate)


@pytest.mark.parametrize(
    ("band", "since", "expected"),
    [
        (point(0, head_age=9.0), 10.0, Wait(0.0, "empty")),
        (point(5, head_age=9.0, deliver_rate=5.0), 10.0, Wait(9.0, "head")),
        (point(50, deliver_rate=10.0), 10.0, Wait(5.0, "estimate")),
        (point(50, deliver_rate=0.0), 70.0, Wait(30.0, "backlog", "at_least")),
        (point(None), 70.0, Wait(None, None)),
        (point(3), None, Wait(None, None)),
    ],
)
def test_the_wait_shown_is_the_best_figure_the_broker_gives(
    band: BandPoint, since: float | None, expected: Wait
) -> None:
    assert band_wait(band, since, now=100.0) == expected


@pytest.mark.parametrize(
    ("empty_at", "expected"),
    [
        (98.0, Wait(2.0, "backlog", "at_most")),  # empty one sample ago: younger than that
        (None, Wait(None, "backlog")),  # never seen empty: nothing says how old it is
    ],
)
def test_a_backlog_first_seen_now_is_never_shown_as_waiting_zero(
    empty_at: float | None, expected: Wait
) -> None:
    assert band_wait(point(4), backlog_since=100.0, now=100.0, empty_at=empty_at) == expected


def test_a_backlog_found_on_the_first_sample_has_an_unknown_then_a_growing_lower_bound() -> None:
    history = QueueHistory(window=60.0)
    history.record({"cold": point(4)}, 0.0, dead_lettered=0)
    first = history.to_json(now=0.0)
    assert (first["bands"][0]["wait_seconds"], first["bands"][0]["wait_source"]) == (
        None,
        "backlog",
    )
    assert first["chart"]["cold"] == [[0.0, None]]  # nothing drawn for it
    history.record({"cold": point(4)}, 2.0, dead_lettered=0)
    (cold,) = history.to_json(now=2.0)["bands"]
    assert (cold["wait_seconds"], cold["wait_source"], cold["wait_bound"]) == (
        2.0,
        "backlog",
        "at_least",
    )


def test_a_backlog_that_starts_after_an_empty_sample_is_bounded_by_that_sample() -> None:
    history = QueueHistory(window=60.0)
    history.record({"cold": point(0)}, 0.0, dead_lettered=0)
    history.record({"cold": point(4)}, 2.0, dead_lettered=0)
    (cold,) = history.to_json(now=2.0)["bands"]
    assert (cold["wait_seconds"], cold["wait_bound"]) == (2.0, "at_most")


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) is None


def test_rates_come_from_the_management_api_view() -> None:
    view = {"message_stats": {"publish_details": {"rate": 2.5}, "deliver_get_details": {"rate": 1}}}
    assert management_rates(view) == (2.5, 1.0)
    assert management_rates({"name": "orders.hot", "messages": 0}) == (0.0, 0.0)
    # Listed before the statistics database sampled it: no counts at all, rates unknown.
    assert management_rates({"name": "orders.hot"}) == (None, None)
    assert management_rates(None) == (None, None)


def test_a_backlog_nothing_drains_shows_a_growing_wait_and_old_samples_leave() -> None:
    history = QueueHistory(window=60.0)
    for now, ready in [(0.0, 0), (10.0, 4), (40.0, 4), (100.0, 4)]:
        history.record({"cold": point(ready, deliver_rate=0.0)}, now, dead_lettered=1)
    view = history.to_json(now=100.0)
    (cold,) = view["bands"]
    assert cold["wait_seconds"] == 90.0
    assert (cold["wait_source"], cold["wait_bound"]) == ("backlog", "at_least")
    assert view["chart"]["cold"] == [[-60.0, 30.0], [0.0, 90.0]]  # 0 s and 10 s fell out
    assert cold["wait_p50_seconds"] == 30.0
    assert cold["wait_p99_seconds"] == 90.0
    assert view["dead_lettered"] == 1
    assert "delayed" not in view  # the delay ladder's count is the deployment's, not a queue's

    history.record({"cold": point(0)}, 101.0, dead_lettered=1)
    assert history.to_json(now=101.0)["bands"][0]["wait_source"] == "empty"

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
        (point(50, deliver_rate=0.0), 70.0, Wait(30.0, "backlog")),
        (point(None), 70.0, Wait(None, None)),
        (point(3), None, Wait(None, None)),
    ],
)
def test_the_wait_shown_is_the_best_figure_the_broker_gives(
    band: BandPoint, since: float | None, expected: Wait
) -> None:
    assert band_wait(band, since, now=100.0) == expected


def test_percentiles_are_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) is None


def test_rates_come_from_the_management_api_view() -> None:
    view = {"message_stats": {"publish_details": {"rate": 2.5}, "deliver_get_details": {"rate": 1}}}
    assert management_rates(view) == (2.5, 1.0)
    assert management_rates({"name": "orders.hot"}) == (0.0, 0.0)
    assert management_rates(None) == (None, None)


def test_a_backlog_nothing_drains_shows_a_growing_wait_and_old_samples_leave() -> None:
    history = QueueHistory(window=60.0)
    for now, ready in [(0.0, 0), (10.0, 4), (40.0, 4), (100.0, 4)]:
        history.record({"cold": point(ready, deliver_rate=0.0)}, now, delayed=0, dead_lettered=1)
    view = history.to_json(now=100.0)
    (cold,) = view["bands"]
    assert cold["wait_seconds"] == 90.0
    assert cold["wait_source"] == "backlog"
    assert view["chart"]["cold"] == [[-60.0, 30.0], [0.0, 90.0]]  # 0 s and 10 s fell out
    assert cold["wait_p50_seconds"] == 30.0
    assert cold["wait_p99_seconds"] == 90.0
    assert view["dead_lettered"] == 1

    history.record({"cold": point(0)}, 101.0, delayed=0, dead_lettered=1)
    assert history.to_json(now=101.0)["bands"][0]["wait_source"] == "empty"

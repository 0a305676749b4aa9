"""Per-token budgets (`bandgate.gateway.budgets`): seats held at once, events in a window."""

from __future__ import annotations

import random

import pytest

from bandgate.core import error_codes
from bandgate.gateway.budgets import SLOTS, Seats, Window
from bandgate.gateway.errors import ApiError
from bandgate.pull.settings import PullSettings


def test_a_token_holds_its_seats_and_leaves_the_rest_to_others() -> None:
    seats = Seats(2, 3, error_codes.TOO_MANY_RECEIVES, "receives")
    with seats.taken("a"), seats.taken("a"):
        with pytest.raises(ApiError) as refused, seats.taken("a"):
            pass
        assert refused.value.code == "too_many_receives"
        assert refused.value.headers == {"Retry-After": "1"}
        with seats.taken("b"):
            with pytest.raises(ApiError, match="all tokens together"), seats.taken("c"):
                pass
            assert len(seats) == 3
    assert len(seats) == 0
    assert seats.held("a") == 0


def test_a_seat_is_given_back_when_its_request_fails() -> None:
    seats = Seats(1, 1, error_codes.TOO_MANY_RECEIVES, "receives")
    with pytest.raises(RuntimeError), seats.taken("a"):
        raise RuntimeError
    with seats.taken("a"):
        assert seats.held("a") == 1


def test_a_window_refuses_past_its_limit_until_the_oldest_slot_leaves() -> None:
    window = Window(3, 64.0, error_codes.TOO_MANY_TOMBSTONES, "tombstones")
    for now in (0.0, 10.0, 20.0):
        window.take("a", now)
    with pytest.raises(ApiError) as refused:
        window.take("a", 30.0)
    assert refused.value.code == "too_many_tombstones"
    # The slot of t=0 (one second wide) leaves the window once 65 s have passed: 35 s more.
    assert refused.value.headers == {"Retry-After": "35"}
    window.take("b", 30.0)  # another token has its own budget
    with pytest.raises(ApiError):
        window.take("a", 64.5)
    window.take("a", 65.0)
    assert window.spent("a") == 3


def test_no_stretch_of_a_window_holds_more_than_the_limit() -> None:
    """Whatever the timing, any `seconds`-long stretch counts at most `limit` taken events."""
    rng = random.Random(7)
    limit, seconds = 20, 10.0
    window = Window(limit, seconds, error_codes.TOO_MANY_TOMBSTONES, "tombstones")
    taken = []
    now = 0.0
    for _ in range(5000):
        now += rng.expovariate(8.0)
        try:
            window.take("a", now)
        except ApiError:
            continue
        taken.append(now)
    assert len(taken) > 100
    for index, start in enumerate(taken):
        inside = sum(1 for moment in taken[index:] if moment < start + seconds)
        assert inside <= limit
    assert SLOTS == 64


def test_the_documented_arithmetic_of_the_receivers_budgets() -> None:
    """The figures docs/guides/limits.md gives, from the functions that decide them."""
    defaults = PullSettings()
    assert defaults.receive_seats(1000) == (32, 500)
    assert defaults.receive_seats(16) == (4, 8)
    assert defaults.receive_seats(2) == (1, 1)
    body = 256 * 1024
    assert defaults.queue_leases(3, body) == 85  # 64 MiB / (3 x 256 KiB)
    assert 3 * defaults.queue_leases(3, body) * body <= defaults.max_prefetch_bytes
    assert defaults.queue_leases(3, 16 * 1024) == 256  # capped at max_leases
    assert defaults.queue_leases(1, 64 << 20) == 10  # the floor: one full receive
    assert PullSettings(max_leases=4).queue_leases(3, body) == 4
    assert defaults.token_leases(85) == 42
    assert defaults.token_lease_limit == 128

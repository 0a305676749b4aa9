"""The tombstone ledger's rules (`core.ledger`): which copy of an id still runs."""

from __future__ import annotations

import pytest

from bandgate.core import ledger
from bandgate.core.ledger import Entry, LedgerEntryError, LedgerView, decode

DAY = 24 * 3600
T = ledger.now_ms()  # entries are stamped with the writer's clock; older ones expire on apply


def test_a_cancel_kills_every_copy_published_before_it() -> None:
    view = LedgerView(DAY)
    view.apply(ledger.cancel("orders", "m1", at_ms=T + 5_000))
    assert view.verdict("orders", "m1", 0) == "cancelled"  # a first publish
    assert view.verdict("orders", "m1", T + 4_999) == "cancelled"  # a replacement made before it
    assert view.verdict("orders", "m1", T + 5_001) is None  # a replacement made after it runs
    assert view.verdict("orders", "m2", 0) is None
    assert view.verdict("payments", "m1", 0) is None  # ids are per queue


def test_a_replace_supersedes_the_older_generations_only() -> None:
    view = LedgerView(DAY)
    view.apply(ledger.replace("orders", "m1", generation=T + 7_000))
    assert view.verdict("orders", "m1", 0) == "superseded"
    assert view.verdict("orders", "m1", T + 7_000) is None  # the replacement itself


def test_the_newest_tombstone_wins_whatever_order_they_are_read_in() -> None:
    first, second = (
        ledger.replace("orders", "m1", T + 7_000),
        ledger.cancel("orders", "m1", T + 9_000),
    )
    for order in ((first, second), (second, first)):
        view = LedgerView(DAY)
        for entry in order:
            view.apply(entry)
        assert view.verdict("orders", "m1", T + 7_000) == "cancelled"
        assert view.verdict("orders", "m1", T + 9_001) is None


def test_a_replace_after_a_cancel_runs_its_new_generation() -> None:
    view = LedgerView(DAY)
    view.apply(ledger.cancel("orders", "m1", at_ms=T + 5_000))
    view.apply(ledger.replace("orders", "m1", generation=T + 6_000))
    assert view.verdict("orders", "m1", T + 6_000) is None
    assert view.verdict("orders", "m1", 0) == "superseded"


def test_handled_ids_are_duplicates_only_for_a_consumer_that_dedupes() -> None:
    view = LedgerView(DAY)
    view.apply(ledger.handled("orders", "m1", generation=0))
    assert view.verdict("orders", "m1", 0) is None
    assert view.verdict("orders", "m1", 0, dedupe=True) == "duplicate"
    # A replacement of a handled message is new work.
    assert view.verdict("orders", "m1", T + 8_000, dedupe=True) is None


def test_entries_leave_the_view_when_the_window_passes_over_them() -> None:
    t = ledger.now_ms()  # this window is 60 s: stamp entries now, not at import
    view = LedgerView(60)
    view.apply(Entry("cancel", "orders", "old", t + 1_000, t + 1_000))
    view.apply(Entry("handled", "orders", "old", 0, t + 1_000))
    view.apply(Entry("cancel", "orders", "new", t + 50_000, t + 50_000))
    assert len(view) == 3
    view.expire(now=t + 61_500)  # the window reaches back to t + 1,500 ms
    assert len(view) == 1
    assert view.verdict("orders", "old", 0) is None
    assert view.verdict("orders", "new", 0) == "cancelled"


def test_an_updated_tombstone_moves_to_the_back_of_the_expiry_line() -> None:
    t = ledger.now_ms()  # this window is 60 s: stamp entries now, not at import
    view = LedgerView(60)
    view.apply(Entry("cancel", "orders", "a", t + 1_000, t + 1_000))
    view.apply(Entry("cancel", "orders", "b", t + 2_000, t + 2_000))
    view.apply(Entry("cancel", "orders", "a", t + 3_000, t + 3_000))
    view.expire(now=t + 62_500)  # past b (+2,000), not past a's newest write (+3,000)
    assert view.verdict("orders", "a", 0) == "cancelled"
    assert view.verdict("orders", "b", 0) is None


def test_an_entry_from_the_far_future_does_not_hold_back_expiry() -> None:
    """Issue 33, finding 11: one entry stamped years ahead (a forged write to the ledger stream,
    or a clock far off) stopped in-memory expiry behind it. It counts as written at most a
    minute from now, so it and everything after it leave with the window."""
    t = ledger.now_ms()
    view = LedgerView(60)
    view.apply(Entry("cancel", "orders", "far", 1, t + 10 * 365 * 86_400_000))
    view.apply(Entry("cancel", "orders", "b", 1, t + 1_000))
    view.expire(now=t + 61_500)  # past b, not yet past the clamped far entry
    assert len(view) == 2  # b waits behind the far one, as written order says...
    view.expire(now=t + 130_000)  # ...but only until a minute past now plus the window
    assert len(view) == 0


def test_entries_older_than_the_window_are_not_kept() -> None:
    t = ledger.now_ms()  # this window is 60 s: stamp entries now, not at import
    view = LedgerView(60)
    view.apply(ledger.cancel("orders", "m1", at_ms=t - 61_000))  # read late from the stream
    assert len(view) == 0


def test_entries_round_trip_and_foreign_ones_are_refused() -> None:
    entry = ledger.replace("orders", "m/1", 7_000)
    assert decode(entry.encode()) == entry
    for body in (b"not json", b"{}", b'{"op": "erase", "queue": "q", "message_id": "m", '
                 b'"generation": 1, "at": 1}', b'{"op": "cancel", "queue": "q", '
                 b'"message_id": "m", "generation": true, "at": 1}'):  # fmt: skip
        with pytest.raises(LedgerEntryError):
            decode(body)


def test_the_generation_header_of_a_first_publish_is_zero() -> None:
    assert ledger.generation_of(None) == 0
    assert ledger.generation_of({}) == 0
    assert ledger.generation_of({"x-bandgate-generation": 7_000}) == 7_000
    assert ledger.generation_of({"x-bandgate-generation": b"7000"}) == 7_000


def test_generations_given_out_in_one_millisecond_still_differ() -> None:
    generations = [ledger.new_generation() for _ in range(1000)]
    assert generations == sorted(set(generations))
    assert generations[0] >= T

"""The lease book: receipts, per-token counts, visibility timers, one end per lease."""

from __future__ import annotations

import asyncio

import pytest

from bandgate.consumers.testing import make_message
from bandgate.pull.leases import Acked, Lapsed, LeaseBook, LeaseGone, Released
from bandgate.pull.receipts import ReceiptError, Signer, parse


def book() -> LeaseBook:
    return LeaseBook(Signer("0123456789abcdef"))


async def test_a_lease_is_found_by_its_receipt_until_decided() -> None:
    leases = book()
    lease = leases.open("orders", make_message({}, queue="orders"), 30, "worker")
    assert leases.find(parse(lease.receipt), "orders") is lease
    assert leases.held("worker") == 1
    with pytest.raises(ReceiptError):
        leases.find(parse(lease.receipt), "emails")
    assert lease.end(Acked())
    assert not lease.end(Released())  # one end only
    with pytest.raises(LeaseGone):
        leases.find(parse(lease.receipt), "orders")
    leases.close(lease)
    assert leases.held("worker") == 0
    assert len(leases) == 0


async def test_the_visibility_timer_lapses_a_lease_and_extending_moves_it() -> None:
    leases = book()
    lease = leases.open("orders", make_message({}, queue="orders"), 0.05, "worker")
    loop = asyncio.get_running_loop()
    extended_at = loop.time()
    lease.hide_for(0.3)  # extended before it lapsed
    assert isinstance(await asyncio.wait_for(lease.ended, 10), Lapsed)
    # At the extended end, not the first: timed after the fact, which a loaded machine can
    # only make later, never sooner.
    assert loop.time() - extended_at >= 0.3 - 0.01


async def test_deciding_stops_the_timer() -> None:
    leases = book()
    lease = leases.open("orders", make_message({}, queue="orders"), 0.05, "worker")
    assert lease.end(Released(delay=1.0, reason="busy"))
    await asyncio.sleep(0.1)
    assert lease.ended.result() == Released(delay=1.0, reason="busy")


async def test_leases_count_per_token() -> None:
    leases = book()
    opened = [leases.open("orders", make_message({}), 30, name) for name in ("a", "a", "b")]
    assert (leases.held("a"), leases.held("b"), leases.held("c")) == (2, 1, 0)
    assert len({lease.receipt for lease in opened}) == 3
    for lease in opened:
        lease.end(Acked())
        leases.close(lease)
    assert (leases.held("a"), leases.held("b")) == (0, 0)

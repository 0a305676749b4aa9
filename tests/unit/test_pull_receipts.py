"""Receipts: only the process that issued one accepts it, for its queue, unaltered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bandgate.pull.receipts import MAX_RECEIPT_CHARS, ReceiptError, Signer, new_replica_id, parse


def test_a_receipt_names_its_process_and_lease_and_checks_only_there() -> None:
    signer = Signer(new_replica_id())
    text = signer.issue(42, "orders")
    receipt = parse(text)
    assert (receipt.replica, receipt.lease, receipt.text) == (signer.replica, 42, text)
    assert len(text) <= MAX_RECEIPT_CHARS
    signer.verify(receipt, "orders")
    with pytest.raises(ReceiptError):
        signer.verify(receipt, "emails")  # the queue is signed too
    with pytest.raises(ReceiptError):
        Signer(signer.replica).verify(receipt, "orders")  # a restarted process: a new key
    with pytest.raises(ReceiptError):
        Signer(new_replica_id()).verify(receipt, "orders")


@given(st.integers(min_value=1, max_value=10**17), st.data())
def test_any_altered_character_is_refused(lease: int, data: st.DataObject) -> None:
    signer = Signer("0123456789abcdef", key=b"k" * 32)
    text = signer.issue(lease, "orders")
    position = data.draw(st.integers(min_value=0, max_value=len(text) - 1))
    replacement = data.draw(st.sampled_from("0123456789abcdefABCXYZ_-."))
    altered = text[:position] + replacement + text[position + 1 :]
    if altered == text:
        return
    with pytest.raises(ReceiptError):
        signer.verify(parse(altered), "orders")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "0123456789abcdef.1",
        "0123456789ABCDEF.1.AAAAAAAAAAAAAAAAAAAAAA",
        "0123456789abcdef.0.AAAAAAAAAAAAAAAAAAAAAA",
        "0123456789abcdef.01.AAAAAAAAAAAAAAAAAAAAAA",
        "0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAA",
        "0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAAA=",
        "0123456789abcdef.1.AAAAAAAAAAAAAAAAAAAAAA\n",
        "0123456789abcdef." + "9" * 19 + ".AAAAAAAAAAAAAAAAAAAAAA",
        "a" * 10_000,
    ],
)
def test_malformed_receipts_are_refused_before_anything_else(text: str) -> None:
    with pytest.raises(ReceiptError):
        parse(text)

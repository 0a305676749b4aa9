"""Receipt handles: which gateway process holds a lease, and proof that it issued the receipt.

A receipt reads `<replica>.<lease>.<signature>`:
- `replica`: the id of the gateway process that leased the message (16 hex digits, new at
  every start), so any other process knows where to forward a settlement (`bandgate.pull.mailbox`);
- `lease`: that process's number for the lease;
- `signature`: HMAC-SHA256 over the replica, the lease and the queue, with a key only the
  issuing process holds (random, made at start), cut to 128 bits.

Only the issuing process can check a signature, and only it needs to: every settlement ends
there. So replicas share no secret, and a receipt forged or altered is refused by the one
process that could act on it. A receipt that names a process that is gone is answered 410,
whatever its signature: nothing is acted on either way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

_FORM = re.compile(r"^([0-9a-f]{16})\.([1-9][0-9]{0,17})\.([A-Za-z0-9_-]{22})$")
MAX_RECEIPT_CHARS = 64


class ReceiptError(ValueError):
    """Not a receipt this API issued (malformed, or its signature does not check)."""


@dataclass(frozen=True)
class Receipt:
    replica: str
    lease: int
    signature: str
    text: str


def parse(text: str) -> Receipt:
    """The parts of a receipt, its form checked (not its signature: see `Signer.verify`)."""
    match = _FORM.fullmatch(text) if len(text) <= MAX_RECEIPT_CHARS else None
    if match is None:
        raise ReceiptError("not a receipt issued by this API")
    return Receipt(match[1], int(match[2]), match[3], text)


def new_replica_id() -> str:
    return secrets.token_hex(8)


class Signer:
    """Issues and checks the receipts of one process."""

    def __init__(self, replica: str, key: bytes | None = None) -> None:
        self.replica = replica
        self._key = key or secrets.token_bytes(32)

    def _sign(self, lease: int, queue: str) -> str:
        digest = hmac.new(
            self._key, f"{self.replica}.{lease}.{queue}".encode(), hashlib.sha256
        ).digest()
        return base64.urlsafe_b64encode(digest[:16]).rstrip(b"=").decode()

    def issue(self, lease: int, queue: str) -> str:
        return f"{self.replica}.{lease}.{self._sign(lease, queue)}"

    def verify(self, receipt: Receipt, queue: str) -> None:
        """`ReceiptError` unless this process issued `receipt` for `queue`."""
        if receipt.replica != self.replica or not hmac.compare_digest(
            receipt.signature, self._sign(receipt.lease, queue)
        ):
            raise ReceiptError("the receipt's signature does not check (altered, or forged)")


__all__ = ["MAX_RECEIPT_CHARS", "Receipt", "ReceiptError", "Signer", "new_replica_id", "parse"]

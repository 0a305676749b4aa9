"""Per-token budgets on what a request holds, or leaves behind, in one gateway process.

A rate limit bounds how often a token asks; these bound what its asking occupies, so that one
tenant cannot take a shared resource from the others (issue 33):

- `Seats`: requests of one kind open at once, per token and for all tokens together. The HTTP
  receivers (`bandgate.pull`) seat their receives here, so one token's long polls cannot take
  the process's connections (`BANDGATE_MAX_CONNECTIONS`) from the others.
- `Window`: events per token over a sliding window. Cancels, replaces and escalates each write
  one tombstone to the ledger stream, which the broker trims by bytes: a token that wrote
  without a bound would push every other tenant's tombstones out before their time.

Every refusal is a 429 with its own code and Retry-After, counted under the token's name
(`bandgate_token_refused`) as well as by queue (`bandgate_rejected`). The table of budgets is
in docs/guides/limits.md.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

from bandgate.core.error_codes import ErrorCode
from bandgate.gateway.errors import ApiError


class Seats:
    """At most `per_token` requests of one token, and `total` of all tokens, open at once."""

    def __init__(self, per_token: int, total: int, error: ErrorCode, what: str) -> None:
        self.per_token = per_token
        self.total = total
        self._error = error
        self._what = what
        self._held: collections.Counter[str] = collections.Counter()
        self._open = 0

    @contextmanager
    def taken(self, owner: str) -> Iterator[None]:
        """A seat for the request's whole run; 429 (`error`) when none is free."""
        if self._held[owner] >= self.per_token:
            raise self._refusal(f"token {owner!r} has {self.per_token} {self._what} open")
        if self._open >= self.total:
            raise self._refusal(f"all tokens together have {self.total} {self._what} open")
        self._held[owner] += 1
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1
            self._held[owner] -= 1
            if not self._held[owner]:
                del self._held[owner]

    def held(self, owner: str) -> int:
        return self._held[owner]

    def __len__(self) -> int:
        return self._open

    def _refusal(self, why: str) -> ApiError:
        return ApiError.of(
            self._error,
            f"{why} in this gateway process, the limit: wait for one to end",
            headers={"Retry-After": "1"},
        )


SLOTS = 64  # a window's resolution: counts are kept per 1/64 of it


class Window:
    """At most `limit` events of one token in any `seconds`-long stretch of time.

    Counted in `SLOTS` slots per window (a token costs at most `SLOTS + 1` small entries,
    whatever its rate), and a slot is forgotten only once the whole window has passed over it,
    so the bound holds for every stretch of `seconds`, not only for aligned ones; a token that
    spent its budget waits for its oldest slot to leave the window (Retry-After)."""

    def __init__(self, limit: int, seconds: float, error: ErrorCode, what: str) -> None:
        self.limit = limit
        self.seconds = seconds
        self._width = seconds / SLOTS
        self._error = error
        self._what = what
        # owner -> [slot number, events in it], oldest first; and their sum
        self._slots: dict[str, collections.deque[list[int]]] = {}
        self._sums: collections.Counter[str] = collections.Counter()

    def take(self, owner: str, now: float | None = None) -> None:
        """Count one event of `owner`, or raise 429 (`error`, counting none)."""
        now = time.monotonic() if now is None else now
        slot = math.floor(now / self._width)
        slots = self._slots.setdefault(owner, collections.deque())
        while slots and slots[0][0] < slot - SLOTS:
            self._sums[owner] -= slots.popleft()[1]
        if self._sums[owner] >= self.limit:
            wait = (slots[0][0] + SLOTS + 1) * self._width - now  # the oldest slot leaves
            raise ApiError.of(
                self._error,
                f"token {owner!r} wrote {self.limit} {self._what} in the last "
                f"{self.seconds:g} s in this gateway process, the limit",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            )
        if slots and slots[-1][0] == slot:
            slots[-1][1] += 1
        else:
            slots.append([slot, 1])
        self._sums[owner] += 1

    def spent(self, owner: str) -> int:
        """Events of `owner` still counted."""
        return self._sums[owner]


__all__ = ["SLOTS", "Seats", "Window"]

"""The tombstone ledger: what cancel, replace and dedupe record, and which copies to skip.

A message inside a RabbitMQ queue cannot be changed or removed in place. So a cancel or a
replace appends a tombstone to one stream (`naming.ledger_stream`), every worker process and
HTTP receiver follows that stream (`core.ledger_follower`) into a `LedgerView`, and a consumer
asks the view, when a message reaches the head of its band, whether that copy is still wanted.
A skipped copy is acked without running the handler.

Generations tell copies of one message id apart. A first publish is generation 0 (no
`wire.GENERATION` header); a replacement carries its replace's time in milliseconds since the
epoch. A tombstone says "every copy of this id older than generation g is dead":
- cancel: g is the cancel's time, so it kills what was published before it, replacements
  included, and a later replace publishes a generation that runs;
- replace: g is the new generation, confirmed before the tombstone is written, so a crash in
  between leaves a duplicate, never a loss.
The times come from the writers' clocks: two gateway processes whose clocks differ by more than
the time between a replace and a cancel of the same id can order them wrongly.

`handled` entries serve consumers that dedupe by message id: a copy of an id whose generation
already ran is a duplicate. Entries leave the view when the ledger's retention window
(`LedgerSettings.max_age_seconds`) has passed over them, so memory follows the window.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import orjson

from bandgate.topology import wire

Op = Literal["cancel", "replace", "handled", "mark"]
OPS: tuple[Op, ...] = get_args(Op)
Verdict = Literal["cancelled", "superseded", "duplicate"]

# How long a process waits by default to read the ledger up to now (`core.ledger_follower`): a
# 128 MiB ledger (about 460,000 entries) reads in about 20 s at the 24,000 entries/s that
# `python -m bench ledger` measured.
CATCHUP_SECONDS = 60.0
# An entry stamped further ahead than this (a writer's clock, or a forged entry) counts as
# written now plus this much: expiry walks the entries in the order they were written and stops
# at the first one still inside the window, so one entry from the far future would keep every
# later one in memory for as long.
CLOCK_SKEW_MS = 60_000


class LedgerEntryError(ValueError):
    """A ledger entry bandgate did not write (or a newer version wrote): skipped, logged."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One ledger record. `generation`: cancel and replace kill the copies older than it;
    handled names the generation that ran. A `mark` only tells its writer it caught up."""

    op: Op
    queue: str
    message_id: str
    generation: int
    at_ms: int

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "op": self.op,
                "queue": self.queue,
                "message_id": self.message_id,
                "generation": self.generation,
                "at": self.at_ms,
            }
        )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


_last_generation = 0


def new_generation() -> int:
    """A replacement's generation: the time in milliseconds, but never one this process gave
    out before, so two replaces of an id in one millisecond still supersede each other."""
    global _last_generation
    _last_generation = max(now_ms(), _last_generation + 1)
    return _last_generation


def cancel(queue: str, message_id: str, at_ms: int | None = None) -> Entry:
    at = now_ms() if at_ms is None else at_ms
    return Entry("cancel", queue, message_id, at, at)


def replace(queue: str, message_id: str, generation: int) -> Entry:
    return Entry("replace", queue, message_id, generation, now_ms())


def handled(queue: str, message_id: str, generation: int) -> Entry:
    return Entry("handled", queue, message_id, generation, now_ms())


def mark(token: str) -> Entry:
    return Entry("mark", "", token, 0, now_ms())


def decode(body: bytes) -> Entry:
    try:
        data: Any = orjson.loads(body)
        op, queue, message_id = data["op"], data["queue"], data["message_id"]
        generation, at = data["generation"], data["at"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise LedgerEntryError(f"not a ledger entry: {exc}") from None
    if op not in OPS or not isinstance(queue, str) or not isinstance(message_id, str):
        raise LedgerEntryError(f"not a ledger entry: {data!r:.200}")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (generation, at)):
        raise LedgerEntryError(f"not a ledger entry: {data!r:.200}")
    return Entry(op, queue, message_id, generation, at)


def generation_of(headers: Mapping[str, Any] | None) -> int:
    """The generation a received copy carries (0: a first publish)."""
    return wire.header_int((headers or {}).get(wire.GENERATION)) or 0


class LedgerView:
    """The tombstones and handled ids of the retention window, in memory.

    Each map is kept in the order entries were written (an updated key moves to the end), so
    expiry pops from the front only.
    """

    def __init__(self, max_age_seconds: float) -> None:
        self.max_age_ms = int(max_age_seconds * 1000)
        # key -> (dead below this generation, written at, by a cancel)
        self._dead: dict[str, tuple[int, int, bool]] = {}
        # key -> (generation handled, written at)
        self._handled: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self._dead) + len(self._handled)

    def apply(self, entry: Entry) -> None:
        key = _key(entry.queue, entry.message_id)
        at_ms = min(entry.at_ms, now_ms() + CLOCK_SKEW_MS)
        if entry.op == "handled":
            known = self._handled.pop(key, None)
            generation = entry.generation if known is None else max(known[0], entry.generation)
            self._handled[key] = (generation, at_ms)
        elif entry.op in ("cancel", "replace"):
            dead = self._dead.pop(key, None)
            if dead is not None and dead[0] >= entry.generation:
                self._dead[key] = (dead[0], max(dead[1], at_ms), dead[2])
            else:
                self._dead[key] = (entry.generation, at_ms, entry.op == "cancel")
        self.expire()

    def verdict(
        self, queue: str, message_id: str, generation: int, *, dedupe: bool = False
    ) -> Verdict | None:
        """Why this copy must not run, or None to run it."""
        key = _key(queue, message_id)
        dead = self._dead.get(key)
        if dead is not None and generation < dead[0]:
            return "cancelled" if dead[2] else "superseded"
        if dedupe:
            done = self._handled.get(key)
            if done is not None and generation <= done[0]:
                return "duplicate"
        return None

    def expire(self, now: int | None = None) -> None:
        """Forget what the retention window has passed over."""
        oldest = (now_ms() if now is None else now) - self.max_age_ms
        for entries in (self._dead, self._handled):
            while entries:
                key = next(iter(entries))
                if entries[key][1] >= oldest:
                    break
                del entries[key]


def _key(queue: str, message_id: str) -> str:
    return f"{queue}/{message_id}"  # queue names hold no '/'


__all__ = [
    "CATCHUP_SECONDS",
    "Entry",
    "LedgerEntryError",
    "LedgerView",
    "Op",
    "Verdict",
    "cancel",
    "decode",
    "generation_of",
    "handled",
    "mark",
    "new_generation",
    "now_ms",
    "replace",
]

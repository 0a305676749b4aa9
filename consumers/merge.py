"""A band's buffer: one sequence per queue of the band, and the merge over their heads.

A sharded band is N quorum queues (`QueueSpec.band_queues`). Each shard delivers in its own
broker order: by priority on RabbitMQ 4.3 (strict, up to 32 levels), 5-9 ahead of 0-4 on 4.0,
publish order on 3.10. Kept in one arrival-ordered buffer, the shards would reach the slots in
whatever order their deliveries happened to arrive, so a priority 2 message of one shard could
start while a priority 9 message of another waited at hand. So each shard's deliveries are kept
in a sequence of their own, in arrival order (its broker order), and a free slot starts the best
head among them: highest priority, then oldest enqueue time, then the lowest shard (`Rank`).
Comparing the heads is enough, O(shards) per pick: the broker delivered each shard's head first
because it ranked first among what that shard had ready then.

Per-key order holds: a key's messages all come from one shard, in its order, and a shard's head
is its first buffered message whose key is not running (`busy`), so the first message of a key
at hand is its oldest (`consumers.dispatch`). A band of one queue is one sequence in arrival
order, as before the merge. `ShardMerge` tells the dispatcher how many queues each band has,
which queue an item came from and how it ranks; without one every band is one sequence.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# Smaller starts first: (-priority, enqueue time in milliseconds since the epoch).
Rank = tuple[int, float]
_FIRST = (0, 0)  # the head of a band of one queue whose first item is free


@dataclass(frozen=True)
class ShardMerge(Generic[T]):
    shards: Sequence[int]  # queues per band, hottest band first
    source: Callable[[T], int]  # the index of the queue (shard) an item came from
    rank: Callable[[T], Rank]


class BandBuffer(Generic[T]):
    """The messages of one band at hand in a worker, a sequence per queue of the band."""

    def __init__(
        self,
        shards: int = 1,
        key: Callable[[T], str | None] = lambda _: None,
        source: Callable[[T], int] = lambda _: 0,
        rank: Callable[[T], Rank] = lambda _: (0, 0.0),
    ) -> None:
        if shards < 1:
            raise ValueError("a band has at least one queue")
        self._sequences: list[deque[T]] = [deque() for _ in range(shards)]
        self._key = key
        self._source = source if shards > 1 else lambda _: 0
        self._rank = rank
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[T]:
        """Every item, shard by shard, each shard's in its order."""
        for sequence in self._sequences:
            yield from sequence

    def append(self, item: T) -> None:
        self._sequences[self._source(item)].append(item)
        self._count += 1

    def head(self, busy: Container[str]) -> tuple[int, int] | None:
        """Where the item to start next is, (shard, position), or None when no item's key is
        free: the best of the shards' first items whose keys are not `busy`."""
        if len(self._sequences) == 1:
            sequence = self._sequences[0]
            if not sequence:
                return None
            key = self._key(sequence[0])
            if key is None or key not in busy:  # the common case, on the worker's hot path
                return _FIRST
            position = self._first_free(sequence, busy)
            return None if position is None else (0, position)
        best: tuple[int, int] | None = None
        best_rank: Rank | None = None
        for shard, sequence in enumerate(self._sequences):
            position = self._first_free(sequence, busy)
            if position is None:
                continue
            rank = self._rank(sequence[position])
            if best_rank is None or rank < best_rank:  # ties: the lower shard
                best, best_rank = (shard, position), rank
        return best

    def at_hand(self, busy: Container[str]) -> list[T]:
        """Every item whose key is not `busy`, shard by shard (for measuring the merge)."""
        return [item for item in self if (key := self._key(item)) is None or key not in busy]

    def pop(self, at: tuple[int, int]) -> T:
        """Take the item at `at` (from `head`) out."""
        shard, position = at
        sequence = self._sequences[shard]
        item = sequence[position]
        del sequence[position]
        self._count -= 1
        return item

    def discard(self, drop: Callable[[T], bool]) -> list[T]:
        """Take the items for which `drop` is true out, keeping the others in order."""
        dropped = [item for item in self if drop(item)]
        if dropped:
            for index, sequence in enumerate(self._sequences):
                self._sequences[index] = deque(item for item in sequence if not drop(item))
            self._count -= len(dropped)
        return dropped

    def clear(self) -> None:
        for sequence in self._sequences:
            sequence.clear()
        self._count = 0

    def _first_free(self, sequence: deque[T], busy: Container[str]) -> int | None:
        # The first item of a key is its oldest, so skipping busy keys keeps per-key order.
        for position, item in enumerate(sequence):
            key = self._key(item)
            if key is None or key not in busy:
                return position
        return None


__all__ = ["BandBuffer", "Rank", "ShardMerge"]

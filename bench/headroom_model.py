"""`python -m bench.headroom_model`: the headroom's reserve in a discrete-event model of
`bench priority`'s scenario, without a broker.

`C` slots, a cold backlog always at hand, hot messages arriving as a Poisson stream (burstier
than the bench's paced publisher, whose messages reach the worker with the broker's jitter; a
perfectly steady stream locks into step with fixed handlers and never waits), fixed handler
times; a free slot starts the oldest waiting hot message, else a cold one if the real
`consumers.scheduling.Headroom` admits it (its rule, or a fixed reserve for comparison). What
the model leaves out is what the bench adds: the broker's delivery path and the CPU two cores
share. So the model shows what the slots alone cost a hot message (its wait for a slot, p50 and
p99) and what each reserve costs cold work, for the light and the saturating load; the bench's
hot p99 on top of that is the broker's and the machine's (docs/benchmarks.md).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from bandgate.consumers.scheduling import Headroom, cap

CONCURRENCY = 16
SECONDS = 60.0


@dataclass(frozen=True)
class Load:
    name: str
    handler_ms: float
    hot_rate: float


LOADS = (Load("light", 5.0, 50.0), Load("saturating", 20.0, 0.7 * CONCURRENCY / 0.020))


class FixedReserve(Headroom):
    """The real headroom with a fixed reserve while hotter work is about."""

    def __init__(self, concurrency: int, reserve: int, clock: Clock) -> None:
        super().__init__(concurrency, idle_after=0.5, clock=clock)
        self.fixed = reserve

    def reserve(self, slots: int | None = None) -> int:
        if self.idle_until() is None:
            return 0
        slots = self.concurrency if slots is None else slots
        return min(self.fixed, cap(slots))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def simulate(load: Load, reserve: int | None, seed: int = 1) -> dict[str, float | str]:
    """One run of `SECONDS`; `reserve` None: the headroom's own rule."""
    clock = Clock()
    room = (
        Headroom(CONCURRENCY, idle_after=0.5, clock=clock)
        if reserve is None
        else FixedReserve(CONCURRENCY, reserve, clock)
    )
    rng = random.Random(seed)
    handler = load.handler_ms / 1000
    events: list[tuple[float, str]] = [(rng.expovariate(load.hot_rate), "arrive")]
    waiting: list[float] = []
    waits: list[float] = []
    running = cold_running = cold_done = 0
    while events:
        clock.now, kind = heapq.heappop(events)
        if clock.now > SECONDS:
            break
        if kind == "arrive":
            room.hotter_arrived()
            waiting.append(clock.now)
            heapq.heappush(events, (clock.now + rng.expovariate(load.hot_rate), "arrive"))
        else:
            running -= 1
            room.ended(hotter=kind == "hot")
            if kind == "cold":
                cold_running -= 1
                cold_done += 1
        while running < CONCURRENCY and (waiting or room.admits(running, cold_running)):
            hot = bool(waiting)
            if hot:
                waits.append(clock.now - waiting.pop(0))
            else:
                cold_running += 1
            running += 1
            room.started(hotter=hot)
            heapq.heappush(events, (clock.now + handler, "hot" if hot else "cold"))
    waits.sort()
    return {
        "load": load.name,
        "reserve": "rule" if reserve is None else str(reserve),
        "slot_wait_p50_ms": round(waits[len(waits) // 2] * 1000, 2),
        "slot_wait_p99_ms": round(waits[int(len(waits) * 0.99)] * 1000, 2),
        "cold_msg_s": round(cold_done / SECONDS),
    }


def main() -> None:
    for load in LOADS:
        for reserve in (None, 1, 2, 4, 12):
            row = simulate(load, reserve)
            print("  ".join(f"{key} {value}" for key, value in row.items()), flush=True)


if __name__ == "__main__":
    main()

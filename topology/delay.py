"""The delay ladder: delays built from TTL + dead-letter hops, no plugin needed.

Level k is a quorum queue whose messages expire after `base_ms * 2**k` and dead-letter into
level k-1's exchange (level 0 into the exit exchange). A delay is written in binary into the
routing key, one word per level, most significant first; each level's topic exchange sends a
message whose bit is 1 into its queue and one whose bit is 0 straight on to the next level.
Every queue holds one TTL, so there is no head-of-line blocking, and a delayed message is
replicated like any other. A delay takes `popcount(units)` queue hops.
"""

from __future__ import annotations

from dataclasses import dataclass

from bandgate.topology import naming


@dataclass(frozen=True)
class DelayRoute:
    """Where to publish a delayed message: the entry exchange and the full routing key."""

    exchange: str
    routing_key: str
    delay_ms: int


@dataclass(frozen=True)
class DelayLadder:
    exchange: str
    base_ms: int
    levels: int

    @property
    def max_delay_ms(self) -> int:
        return self.base_ms * ((1 << self.levels) - 1)

    def ttl_ms(self, level: int) -> int:
        return self.base_ms << level

    def units(self, delay_ms: float) -> int:
        """The delay in ladder units, rounded to the nearest unit."""
        if delay_ms < 0:
            raise ValueError("a delay cannot be negative")
        units = int((delay_ms + self.base_ms / 2) // self.base_ms)
        if units >= 1 << self.levels:
            raise ValueError(
                f"a delay of {delay_ms / 1000:.0f} s exceeds the ladder's maximum of "
                f"{self.max_delay_ms // 1000} s"
            )
        return units

    def route(
        self, delay_ms: float, queue: str, priority: int, *, noisy: bool = False
    ) -> DelayRoute | None:
        """The route for a message due in `delay_ms`, or None when it is due now; `noisy`:
        it ends in its band's noisy lane (a fair band's noisy tenant)."""
        units = self.units(delay_ms)
        if units == 0:
            return None
        bits = format(units, f"0{self.levels}b")
        top_level = units.bit_length() - 1
        return DelayRoute(
            exchange=naming.delay_level(self.exchange, top_level),
            routing_key=naming.delayed_routing_key(".".join(bits), queue, priority, noisy=noisy),
            delay_ms=units * self.base_ms,
        )

    def bit_pattern(self, level: int, bit: str) -> str:
        """Topic pattern matching keys whose word for `level` is `bit`."""
        return "*." * (self.levels - 1 - level) + bit + ".#"

    def next_hop(self, level: int) -> str:
        """Exchange a level's expired (or bit-0) messages go on to."""
        if level == 0:
            return naming.delay_exit_exchange(self.exchange)
        return naming.delay_level(self.exchange, level - 1)

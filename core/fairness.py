"""Fairness among tenants: which tenant's publish goes to its fair band's noisy lane.

A band declared `fair` is two quorum queues: the band's own queue and its noisy lane
(`QueueSpec.band_queues`). Workers take the band's queue first and the lane when that is empty,
with a guaranteed share for the lane (`consumers.scheduling.BandBuffer`). A quorum queue on 3.10
is FIFO, so reordering inside a worker's prefetch cannot help once a flood sits in front of the
quiet tenants' messages; the flood has to go elsewhere before it reaches the broker, and this
module decides where, once, for the gateway, the Python producer and the consumers' retries.

Two rules, on publishes rather than in-flight messages, since the publisher is where the
choice is made; a tenant is noisy while either holds:

- **Steady** (Amazon SQS fair queues' rule): among the last `WINDOW` publishes with a tenant to
  one fair band, it has at least `MIN_COUNT` of them and more than
  `max(MIN_SHARE, FAIR_FACTOR / active)` of them, `active` being the tenants in the window. The
  fair-share term keeps equal tenants quiet whatever their number (ten tenants at 10 % each
  are nobody's noisy neighbour; SQS's 10 % alone would flip half of them at random), and still
  finds one of two tenants that sends 3 in 4 messages. A third term keeps chance out: more
  than `CHANCE_SIGMAS` standard deviations of a fair tenant's count above its mean, which
  matters while the window fills after a start (10 % of 300 publishes is 2.9 deviations at ten
  tenants) and near 15 tenants (where 10 % is 4.2).
- **Onset**: among the last `ONSET_WINDOW` publishes, it has at least `ONSET_COUNT` of them and
  more than `ONSET_FACTOR / active` of them. A flood that starts after a calm spell must push
  its share of the long window past the line first (150 of 1,000 for one of ten tenants who
  had 100: about 75 more publishes), and every one of them lands in front of the quiet
  tenants; the short window finds a tenant at twenty times its share within `ONSET_COUNT`
  of its messages. Its line is three times the fair share so that equal tenants are almost
  never flagged by chance: at most 1.7e-5 of the windows (the binomial tail, worst at 10
  tenants; as publishes, flags come in short runs: 5.8e-5 at worst in
  tests/unit/test_fairness.py), and a tenant flagged by chance only has a few messages
  wait in the lane, which every worker takes when the band's own queue has nothing at hand.

Each process decides on what it publishes: gateways behind a load balancer see the same shares.

Cost per publish to a fair band: per window one deque append and pop and two dict updates,
1.4 µs for both (`timeit`, ten tenants, while a benchmark shared the machine; the same as one
window alone in that run); other bands and messages without a tenant skip it.
"""

from __future__ import annotations

import logging
import math
from collections import deque

log = logging.getLogger(__name__)

WINDOW = 1000  # publishes with a tenant remembered per fair band
MIN_COUNT = 30  # SQS: fewer in flight is never noisy
MIN_SHARE = 0.10  # SQS: more than this share of in-flight messages
FAIR_FACTOR = 1.5  # and more than this many times the fair share of the active tenants
CHANCE_SIGMAS = 5.0  # and this many standard deviations above a fair tenant's mean count
ONSET_WINDOW = 50  # the short window that finds a flood as it starts
ONSET_COUNT = 16
ONSET_FACTOR = 3.0  # times the fair share of the tenants active in the long window


class Recent:
    """The last `size` tenants published, and how many publishes each has among them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._order: deque[str] = deque()
        self.counts: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._order)

    def add(self, tenant: str) -> tuple[int, str | None]:
        """Count `tenant`; its count now, and the tenant that left the window with none."""
        counts = self.counts
        order = self._order
        order.append(tenant)
        count = counts[tenant] = counts.get(tenant, 0) + 1
        gone = None
        if len(order) > self.size:
            oldest = order.popleft()
            left = counts[oldest] - 1
            if left:
                counts[oldest] = left
            else:
                del counts[oldest]
                gone = oldest
            if oldest == tenant:
                count -= 1
        return count, gone


class TenantWindow:
    """The last `size` tenants that published to one fair band, and who among them is noisy."""

    def __init__(self, size: int = WINDOW, onset: int = ONSET_WINDOW) -> None:
        if size < 1 or onset < 1:
            raise ValueError("a window holds at least one publish")
        self.size = size
        self._long = Recent(size)
        self._short = Recent(onset)
        self._noisy: set[str] = set()

    def publish(self, tenant: str) -> bool:
        """Count a publish of `tenant`; whether it goes to the noisy lane."""
        count, gone = self._long.add(tenant)
        onset_count, _ = self._short.add(tenant)
        if gone is not None:
            self._noisy.discard(gone)
        noisy = self._steady(count) or self._onset(onset_count)
        self._note(tenant, noisy)
        return noisy

    def _steady(self, count: int) -> bool:
        if count < MIN_COUNT:
            return False
        publishes = len(self._long)
        fair = 1 / len(self._long.counts)
        chance = fair + CHANCE_SIGMAS * math.sqrt(fair * (1 - fair) / publishes)
        return count > max(MIN_SHARE, FAIR_FACTOR * fair, chance) * publishes

    def _onset(self, count: int) -> bool:
        if count < ONSET_COUNT:
            return False
        return count > ONSET_FACTOR / len(self._long.counts) * len(self._short)

    def _note(self, tenant: str, noisy: bool) -> None:
        if noisy == (tenant in self._noisy):
            return
        if noisy:
            self._noisy.add(tenant)
            log.info("tenant %r is noisy: its messages go to the noisy lane", tenant)
        else:
            self._noisy.discard(tenant)
            log.info("tenant %r is quiet again", tenant)

    @property
    def noisy(self) -> frozenset[str]:
        """The tenants whose last publish went to the noisy lane."""
        return frozenset(self._noisy)


class Fairness:
    """A `TenantWindow` per fair band of a topology: (queue, band name) -> window."""

    def __init__(self, fair_bands: list[tuple[str, str]], size: int = WINDOW) -> None:
        self._windows = {band: TenantWindow(size) for band in fair_bands}

    def noisy(self, queue: str, band: str, tenant: str | None) -> bool:
        """Count a publish without delay to `band` of `queue`; whether it goes to the lane."""
        if tenant is None:
            return False
        window = self._windows.get((queue, band))
        return window is not None and window.publish(tenant)


__all__ = [
    "CHANCE_SIGMAS",
    "FAIR_FACTOR",
    "MIN_COUNT",
    "MIN_SHARE",
    "ONSET_COUNT",
    "ONSET_FACTOR",
    "ONSET_WINDOW",
    "WINDOW",
    "Fairness",
    "TenantWindow",
]

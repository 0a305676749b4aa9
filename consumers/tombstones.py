"""What a consumer asks the tombstone ledger (`core.ledger`): is this copy still wanted, and,
for a consumer that dedupes by message id, the record that an id ran.

A copy is asked about once, when it reaches the head of its band and is about to run; one
already running when its tombstone is written runs to its end. A process that cannot read the
ledger (`LedgerFollower.following` is false) skips nothing it has not already learnt of: it
does not pretend to know more.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from bandgate.consumers.message import Message
from bandgate.core.ledger import Verdict, generation_of, handled
from bandgate.core.ledger_follower import LedgerFollower
from bandgate.core.publishing import PublishFailure

log = logging.getLogger(__name__)


class Tombstones:
    def __init__(self, follower: LedgerFollower) -> None:
        self.follower = follower

    def verdict(
        self, message: Message, headers: Mapping[str, Any] | None, *, dedupe: bool
    ) -> Verdict | None:
        """Why this copy must not run (None: run it)."""
        return self.follower.view.verdict(
            message.queue, message.message_id, generation_of(headers), dedupe=dedupe
        )

    async def ran(self, message: Message, headers: Mapping[str, Any] | None) -> None:
        """Record that this copy's id ran, before it is acked: a crash in between runs it at
        most once more, and a copy published again inside the window is skipped. A record
        that fails is logged; the message is acked all the same (its handler did run)."""
        entry = handled(message.queue, message.message_id, generation_of(headers))
        self.follower.view.apply(entry)  # this process knows at once, before the stream says
        try:
            await self.follower.publisher.record(entry.encode())
        except PublishFailure as exc:
            log.warning(
                "could not record message %s as handled (%s): a copy published again may run",
                message.message_id,
                exc,
            )


__all__ = ["Tombstones"]

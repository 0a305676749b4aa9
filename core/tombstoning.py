"""Cancel and replace a pending message: the writes to the tombstone ledger, in their order.

The gateway's routes (`DELETE`, `PUT`, `POST .../escalate` on `/v1/queues/{queue}/messages/
{message_id}`) and the Python producer (`Producer.cancel`, `Producer.replace`) both write
through here, so the order the ledger's rule asks for (`core.ledger`) is written once: a
replacement is confirmed before its tombstone is written, so a failure in between leaves a
duplicate, never a lost message. An escalate is a replace at a hotter priority.
"""

from __future__ import annotations

import dataclasses

from bandgate.core import ledger
from bandgate.core.publish_outcomes import Published, PublishFailure
from bandgate.core.publishing import Publisher
from bandgate.topology import wire
from bandgate.topology.wire import Envelope


class TombstoneNotWritten(Exception):
    """The new generation was published (`published`), but the tombstone for the older copies
    was not written (`failure`): they may still run. Repeating the replace is safe."""

    def __init__(self, published: Published, generation: int, failure: PublishFailure) -> None:
        super().__init__(
            f"generation {generation} of message {published.message_id!r} was published, but "
            f"the tombstone for the older copies was not written ({failure}): they may still run"
        )
        self.published = published
        self.generation = generation
        self.failure = failure


async def cancel(publisher: Publisher, queue: str, message_id: str) -> ledger.Entry:
    """Write the tombstone that kills every copy of `message_id` published before now
    (`PublishFailure` when the ledger did not confirm it)."""
    entry = ledger.cancel(queue, message_id)
    await publisher.record(entry.encode())
    return entry


async def publish_generation(publisher: Publisher, envelope: Envelope) -> tuple[Published, int]:
    """Publish `envelope` as a new generation of its message id, confirmed, then write the
    tombstone that kills the older copies: (what was published, its generation).

    `PublishFailure` when the new generation was not confirmed (nothing was written);
    `TombstoneNotWritten` when it was but its tombstone was not."""
    generation = ledger.new_generation()
    envelope = dataclasses.replace(envelope, extra_headers={wire.GENERATION: generation})
    published = await publisher.publish(envelope)
    entry = ledger.replace(envelope.queue, envelope.message_id, generation)
    try:
        await publisher.record(entry.encode())
    except PublishFailure as failure:
        raise TombstoneNotWritten(published, generation, failure) from None
    return published, generation


__all__ = ["TombstoneNotWritten", "cancel", "publish_generation"]

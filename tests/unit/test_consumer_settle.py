"""Settling: the copy is confirmed before the original is acked, or the original stays unacked."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from aio_pika.exceptions import ChannelInvalidStateError

from bandgate.consumers.decision import Ack, DeadLetter, RetryLater
from bandgate.consumers.settlement import Settled, Settler
from bandgate.consumers.testing import make_message
from bandgate.core.protocol.acks import AckWriter, Unsettled
from bandgate.core.publishing import ChannelSet, ConfirmTimeout, Published, Publisher
from bandgate.topology.model import DelaySettings, QueueSpec, Topology
from bandgate.topology.wire import Envelope

NOW = datetime(2026, 3, 1, tzinfo=UTC)
TOPOLOGY = Topology(queues={"orders": QueueSpec(name="orders")}, delay=DelaySettings(levels=10))
WARM = TOPOLOGY.queue("orders").band("warm")


class FakeDelivery:
    def __init__(self, journal: list[str], *, channel_gone: bool = False) -> None:
        self.journal = journal
        self.channel_gone = channel_gone
        self.body = b'{"order": 1}'
        self.headers: dict[str, Any] = {"tenant": "acme", "x-delivery-count": 1}
        self.content_type = "application/json"
        self.message_id = "m-1"
        self.delivery_tag = 7
        self.channel = self  # acks go to the settler's AckWriter with the delivery's channel

    async def nack(self, requeue: bool = True) -> None:
        self.journal.append(f"nack requeue={requeue}")


class FakePublisher(Publisher):
    def __init__(self, journal: list[str], *, fail: bool = False) -> None:
        super().__init__(TOPOLOGY, cast(ChannelSet, None))
        self.journal = journal
        self.fail = fail
        self.envelopes: list[Envelope] = []
        self.letters: list[aio_pika.Message] = []

    async def publish(self, envelope: Envelope) -> Published:
        if self.fail:
            raise ConfirmTimeout("no confirm")
        self.journal.append("publish retry (confirmed)")
        self.envelopes.append(envelope)
        return cast(Published, None)

    async def dead_letter(self, message: aio_pika.Message, queue: str) -> None:
        if self.fail:
            raise ConfirmTimeout("no confirm")
        self.journal.append(f"publish dead letter to {queue} (confirmed)")
        self.letters.append(message)


class JournalAcks(AckWriter):
    """Acks as `AckWriter` takes them, refused like it does when the channel is gone."""

    def __init__(self, journal: list[str]) -> None:
        super().__init__()
        self.journal = journal

    def ack(self, channel: Any, delivery_tag: int, unsettled: Unsettled | None = None) -> None:
        if channel.channel_gone:
            raise ChannelInvalidStateError
        assert delivery_tag == channel.delivery_tag
        self.journal.append("ack")


def settler(journal: list[str], *, fail: bool = False) -> tuple[Settler, FakePublisher]:
    publisher = FakePublisher(journal, fail=fail)
    return Settler(publisher, clock=lambda: NOW, acks=JournalAcks(journal)), publisher


def delivery(journal: list[str], **options: bool) -> AbstractIncomingMessage:
    return cast(AbstractIncomingMessage, FakeDelivery(journal, **options))


async def test_a_retry_is_confirmed_before_the_original_is_acked() -> None:
    journal: list[str] = []
    settle, publisher = settler(journal)
    settled = await settle.settle(
        delivery(journal), make_message(band="warm"), WARM, RetryLater(2, 2, "ValueError: x")
    )
    assert settled is Settled.ACKED
    assert journal == ["publish retry (confirmed)", "ack"]
    [envelope] = publisher.envelopes
    assert envelope.attempt == 2
    assert envelope.deliver_at is not None
    assert (envelope.deliver_at - NOW).total_seconds() == 2


async def test_a_dead_letter_is_confirmed_before_the_original_is_acked() -> None:
    journal: list[str] = []
    settle, publisher = settler(journal)
    dead = DeadLetter("rejected", "Reject: no", "Reject")
    settled = await settle.settle(delivery(journal), make_message(band="warm"), WARM, dead)
    assert settled is Settled.ACKED
    assert journal == ["publish dead letter to orders (confirmed)", "ack"]
    assert publisher.letters[0].headers["tenant"] == "acme"


@pytest.mark.parametrize(
    "outcome", [RetryLater(1, 2, "x"), DeadLetter("max-attempts", "x", "ValueError")]
)
async def test_an_unconfirmed_copy_leaves_the_original_unacked_for_the_caller(
    outcome: RetryLater | DeadLetter,
) -> None:
    journal: list[str] = []
    settle, _ = settler(journal, fail=True)
    settled = await settle.settle(delivery(journal), make_message(band="warm"), WARM, outcome)
    assert settled is Settled.UNCONFIRMED  # the pipeline gives it back (`ConsumerRunner.give_back`)
    assert journal == []  # neither acked nor nacked here


async def test_an_ack_on_a_lost_channel_is_reported_not_raised() -> None:
    journal: list[str] = []
    settle, _ = settler(journal)
    message = make_message(band="warm")
    settled = await settle.settle(delivery(journal, channel_gone=True), message, WARM, Ack())
    assert settled is Settled.CHANNEL_GONE
    assert journal == []

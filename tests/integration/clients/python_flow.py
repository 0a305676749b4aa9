"""The README's flow through a client that openapi-python-client generated from the gateway's
served document: run by tests/integration/test_generated_clients.py with the generator's own
Python (which has the client's httpx, attrs and dateutil), as `python python_flow.py URL TOKEN`.

Every request is a generated model and every answer is checked to be the generated model the
document promises, so a schema that types a body loosely (or an answer that does not match its
schema) fails here; and the test type-checks this file with mypy --strict against the client."""

from __future__ import annotations

import sys
import uuid
from typing import TypeVar

from bandgate_client import AuthenticatedClient
from bandgate_client.api.default import (
    ack,
    cancel_message,
    escalate_message,
    list_dead_letters,
    publish,
    publish_batch,
    queue_stats,
    receive,
    release,
)
from bandgate_client.models import (
    BatchRequest,
    BatchResponse,
    Cancelled,
    DeadLetters,
    EscalateRequest,
    Headers,
    PriorityName,
    PublishedMessage,
    PublishRequest,
    QueueStats,
    ReceivedMessage,
    ReceiveRequest,
    ReceiveResponse,
    ReleaseRequest,
    ReleaseResponse,
    Replaced,
)
from bandgate_client.models.release_response_outcome import ReleaseResponseOutcome

QUEUE = "orders"
T = TypeVar("T")


def expect(answer: object, kind: type[T]) -> T:
    assert isinstance(answer, kind), f"expected {kind.__name__}, got {answer!r}"
    return answer


def main(url: str, token: str) -> None:
    client = AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)
    with client:
        hot = expect(
            publish.sync(
                QUEUE, client=client, body=PublishRequest(payload={"order_id": 42}, priority=8)
            ),
            PublishedMessage,
        )
        assert hot.band == "hot", hot
        headers = Headers.from_dict({"tenant": "acme"})
        batch = expect(
            publish_batch.sync(
                QUEUE,
                client=client,
                body=BatchRequest(
                    messages=[
                        PublishRequest(payload={"order_id": 1}, priority=PriorityName.LOW),
                        PublishRequest(payload={"order_id": 2}, priority=9, headers=headers),
                    ]
                ),
            ),
            BatchResponse,
        )
        assert [s.band for s in batch.successful] == ["cold", "hot"], batch
        assert not batch.failed, batch
        stats = expect(queue_stats.sync(QUEUE, client=client), QueueStats)
        assert [band.band for band in stats.bands] == ["hot", "warm", "cold"], stats

        messages: list[ReceivedMessage] = []
        while len(messages) < 2:  # a receive answers with what is at hand: one or two
            received = expect(
                receive.sync(
                    QUEUE, client=client, body=ReceiveRequest(max_messages=2, wait_seconds=5)
                ),
                ReceiveResponse,
            )
            assert received.messages, "nothing received in 5 s"
            messages += received.messages
        first, second = messages[:2]
        assert first.band == "hot", first  # hottest band first
        acked = ack.sync_detailed(QUEUE, first.receipt, client=client)
        assert acked.status_code == 204, acked
        released = expect(
            release.sync(
                QUEUE,
                client=client,
                body=ReleaseRequest(receipt=second.receipt, reason="bad input", dead_letter=True),
            ),
            ReleaseResponse,
        )
        assert released.outcome == ReleaseResponseOutcome.DEAD_LETTERED, released

        later = f"later-{uuid.uuid4()}"
        publish.sync(
            QUEUE,
            client=client,
            body=PublishRequest(payload={"order_id": 7}, message_id=later, delay_seconds=30),
        )
        cancelled = expect(cancel_message.sync(QUEUE, later, client=client), Cancelled)
        assert cancelled.message_id == later, cancelled

        slow = f"slow-{uuid.uuid4()}"
        publish.sync(
            QUEUE,
            client=client,
            body=PublishRequest(payload={"order_id": 8}, message_id=slow, priority=0),
        )
        escalated = expect(
            escalate_message.sync(
                QUEUE,
                slow,
                client=client,
                body=EscalateRequest(payload={"order_id": 8}, priority=PriorityName.CRITICAL),
            ),
            Replaced,
        )
        assert escalated.band == "hot", escalated
        assert escalated.generation > 0, escalated

        dead = expect(list_dead_letters.sync(QUEUE, client=client, limit=10), DeadLetters)
        [letter] = dead.messages
        assert letter.message_id == second.message_id, dead
        assert letter.cause == "rejected", dead
        assert "bad input" in (letter.reason or ""), dead
    print("flow ok")


if __name__ == "__main__":
    main(*sys.argv[1:])

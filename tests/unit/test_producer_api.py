"""The producer's public surface: what `bandgate` exports, and the sync wrapper mirroring the
async producer call for call."""

from __future__ import annotations

import importlib
import inspect
from datetime import UTC, datetime

import bandgate
from bandgate.core import publish_outcomes
from bandgate.core.producer import BatchMessage, BatchResult, Producer
from bandgate.core.publish_outcomes import (
    BrokerRejected,
    InvalidMessage,
    NotEnqueued,
    OutcomeUnknown,
    Published,
    PublishFailure,
)
from bandgate.core.publishing import Publisher
from bandgate.core.sync_producer import SyncProducer


def test_every_export_resolves_and_all_lists_exactly_them() -> None:
    assert bandgate.__all__ == sorted(bandgate._EXPORTS)
    for name, module in bandgate._EXPORTS.items():
        assert getattr(bandgate, name) is getattr(importlib.import_module(module), name)
    assert bandgate.Published is Published
    assert bandgate.Producer is Producer
    assert bandgate.SyncProducer is SyncProducer


def test_every_failure_says_whether_the_message_may_be_enqueued() -> None:
    failures = [
        cls
        for cls in vars(publish_outcomes).values()
        if isinstance(cls, type) and issubclass(cls, PublishFailure)
    ]
    assert len(failures) >= 12
    for cls in failures:
        if cls not in (PublishFailure, NotEnqueued, OutcomeUnknown):
            assert issubclass(cls, NotEnqueued) != issubclass(cls, OutcomeUnknown), cls
            assert getattr(bandgate, cls.__name__) is cls


def _parameters(function: object) -> list[tuple[str, object, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in signature.parameters.values() if p.name != "self"]


def test_the_sync_producer_takes_the_async_producers_arguments() -> None:
    for name in ("connect", "publish", "publish_batch"):
        assert _parameters(getattr(SyncProducer, name)) == _parameters(getattr(Producer, name))
    assert _parameters(Producer.connect) == _parameters(SyncProducer.connect)


def test_a_batch_message_has_the_keyword_arguments_of_publish() -> None:
    keywords = {
        name
        for name, kind, _ in _parameters(Producer.publish)
        if kind is inspect.Parameter.KEYWORD_ONLY
    }
    # (`Required` reaches the runtime as text under `from __future__ import annotations`.)
    keys = BatchMessage.__required_keys__ | BatchMessage.__optional_keys__
    assert keys == {"payload"} | keywords


def test_a_batch_result_lists_successes_and_failures_by_index() -> None:
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    ok = Published("m-1", "orders", "hot", 9, moment, None)
    full = BrokerRejected("full")
    bad = InvalidMessage("bad", "priority", "invalid_priority")
    result = BatchResult((bad, ok, full))
    assert result.successful == [(1, ok)]
    assert result.failed == [(0, bad), (2, full)]


def test_the_publisher_keeps_reexporting_the_outcomes() -> None:
    from bandgate.core import publishing

    for name in ("Published", "PublishFailure", "Unroutable", "ConfirmTimeout", "UnknownQueue"):
        assert getattr(publishing, name) is getattr(publish_outcomes, name)
    assert publishing.Publisher is Publisher

"""bandgate: priority bands over RabbitMQ quorum queues.

The names most programs need. The floors hold the rest: `bandgate.topology` (model, names,
wire format), `bandgate.core` (broker link, publishing, telemetry), `bandgate.gateway` (HTTP),
`bandgate.consumers` (the worker library) and `bandgate.ops` (the CLI and operator tools).

The names load on first use, so a process that imports one floor (the gateway imports
`bandgate.gateway`, never the worker library) loads only what that floor needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bandgate.consumers.app import ConsumerApp
    from bandgate.consumers.errors import Reject, Requeue, Retry
    from bandgate.consumers.message import Message
    from bandgate.core.producer import BatchMessage, BatchResult, Producer
    from bandgate.core.publish_outcomes import (
        BrokerBlocked,
        BrokerRejected,
        BrokerUnavailable,
        ConfirmLost,
        ConfirmTimeout,
        InvalidMessage,
        MessageTooLarge,
        NotEnqueued,
        OutcomeUnknown,
        Published,
        PublishFailure,
        TopologyMissing,
        UnknownQueue,
        Unroutable,
    )
    from bandgate.core.sync_producer import SyncProducer

_OUTCOMES = "bandgate.core.publish_outcomes"
_EXPORTS = {
    "BatchMessage": "bandgate.core.producer",
    "BatchResult": "bandgate.core.producer",
    "BrokerBlocked": _OUTCOMES,
    "BrokerRejected": _OUTCOMES,
    "BrokerUnavailable": _OUTCOMES,
    "ConfirmLost": _OUTCOMES,
    "ConfirmTimeout": _OUTCOMES,
    "ConsumerApp": "bandgate.consumers.app",
    "InvalidMessage": _OUTCOMES,
    "Message": "bandgate.consumers.message",
    "MessageTooLarge": _OUTCOMES,
    "NotEnqueued": _OUTCOMES,
    "OutcomeUnknown": _OUTCOMES,
    "Producer": "bandgate.core.producer",
    "Published": _OUTCOMES,
    "PublishFailure": _OUTCOMES,
    "Reject": "bandgate.consumers.errors",
    "Requeue": "bandgate.consumers.errors",
    "Retry": "bandgate.consumers.errors",
    "SyncProducer": "bandgate.core.sync_producer",
    "TopologyMissing": _OUTCOMES,
    "UnknownQueue": _OUTCOMES,
    "Unroutable": _OUTCOMES,
}

# Spelled out for linters and type checkers; tests/unit/test_producer_api.py checks it is
# exactly the keys of _EXPORTS.
__all__ = [
    "BatchMessage",
    "BatchResult",
    "BrokerBlocked",
    "BrokerRejected",
    "BrokerUnavailable",
    "ConfirmLost",
    "ConfirmTimeout",
    "ConsumerApp",
    "InvalidMessage",
    "Message",
    "MessageTooLarge",
    "NotEnqueued",
    "OutcomeUnknown",
    "Producer",
    "PublishFailure",
    "Published",
    "Reject",
    "Requeue",
    "Retry",
    "SyncProducer",
    "TopologyMissing",
    "UnknownQueue",
    "Unroutable",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bandgate' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

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
    from bandgate.consumers.errors import Reject, Retry
    from bandgate.consumers.message import Message

_EXPORTS = {
    "ConsumerApp": "bandgate.consumers.app",
    "Message": "bandgate.consumers.message",
    "Reject": "bandgate.consumers.errors",
    "Retry": "bandgate.consumers.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bandgate' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

"""Test your flows without a broker: the worker and the producer over an in-memory RabbitMQ.

```python
from bandgate.testing import Harness

async with Harness(app) as harness:
    await harness.publish("orders", {"order_id": 7}, priority="high")
    await harness.drain()
```

`Harness` (`bandgate.testing.harness`) runs the app's real consumers, `Producer`, settlement
and tombstone ledger over `MemoryBroker` (`bandgate.testing.memory_broker`), whose timers run
on a `Clock` the test moves; `bandgate.testing.pytest_plugin` gives pytest the
`bandgate_harness` fixture. docs/guides/testing.md shows it and says what it cannot show.

Its floor: above `bandgate.consumers` and `bandgate.core` (and `bandgate.topology`), which it
drives through their public interfaces only (tests/unit/test_consumer_interface.py checks the
worker library's); nothing below imports it. It does not import the gateway either: the
gateway app takes the harness's broker link (`create_app(link=harness.gateway_link())`), a
`BrokerLink` of the core, so a test serves the HTTP API into the harness.
"""

from bandgate.testing.harness import DeadLettered, Harness, Settlement
from bandgate.testing.memory_broker import Clock, MemoryBroker

__all__ = ["Clock", "DeadLettered", "Harness", "MemoryBroker", "Settlement"]

"""The bandgate consumer library: handlers for priority-banded queues, drained hot first.

```python
from bandgate.consumers import ConsumerApp, Message, Retry, Reject

app = ConsumerApp()

@app.consumer("orders", concurrency=8)
async def handle(msg: Message) -> None: ...
```
Run it with `bandgate worker module:app`.

The public interface is `__all__`, in three groups; other packages (`bandgate.pull`) import
nothing else of the library (tests/unit/test_consumer_interface.py checks it):
- writing handlers: `ConsumerApp`, `Message`, `Retry`, `Reject`, `Requeue`;
- what became of a message (`bandgate.consumers.decision`): `Outcome` is one of `Ack`,
  `RetryLater`, `DeadLetter` (with its `DeadLetterCause`), `GiveBack`, `Tombstoned`;
  `MAX_REASON_CHARS` cuts a reason;
- running a consumer yourself (`bandgate.consumers.runner`): a `ConsumerRunner` of a
  `Consumer` (a handler, its queue spec and `ConsumerOptions`) with a `Settler`, its
  `Timings`, the ledger's `Tombstones`, and `RunnerHooks` that hear of every settlement; a
  `Delivery` is what its `take` hands out. `keeps_headroom` says whether a consumer's coldest
  band shares the slots through a headroom, idle after `IDLE_AFTER` seconds by default.
"""

from bandgate.consumers.app import ConsumerApp
from bandgate.consumers.consumer import Consumer, ConsumerOptions
from bandgate.consumers.decision import (
    MAX_REASON_CHARS,
    Ack,
    DeadLetter,
    DeadLetterCause,
    GiveBack,
    Outcome,
    RetryLater,
    Tombstoned,
    Tombstones,
)
from bandgate.consumers.errors import Reject, Requeue, Retry
from bandgate.consumers.message import Message
from bandgate.consumers.runner import ConsumerRunner, RunnerHooks, Timings
from bandgate.consumers.scheduling import IDLE_AFTER, keeps_headroom
from bandgate.consumers.settlement import Settler
from bandgate.consumers.subscription import Delivery

__all__ = [
    "IDLE_AFTER",
    "MAX_REASON_CHARS",
    "Ack",
    "Consumer",
    "ConsumerApp",
    "ConsumerOptions",
    "ConsumerRunner",
    "DeadLetter",
    "DeadLetterCause",
    "Delivery",
    "GiveBack",
    "Message",
    "Outcome",
    "Reject",
    "Requeue",
    "Retry",
    "RetryLater",
    "RunnerHooks",
    "Settler",
    "Timings",
    "Tombstoned",
    "Tombstones",
    "keeps_headroom",
]

"""The bandgate consumer library: handlers for priority-banded queues, drained hot first.

```python
from bandgate.consumers import ConsumerApp, Message, Retry, Reject

app = ConsumerApp()

@app.consumer("orders", concurrency=8)
async def handle(msg: Message) -> None: ...
```
Run it with `bandgate worker module:app`.
"""

from bandgate.consumers.app import ConsumerApp
from bandgate.consumers.errors import Reject, Requeue, Retry
from bandgate.consumers.message import Message

__all__ = ["ConsumerApp", "Message", "Reject", "Requeue", "Retry"]

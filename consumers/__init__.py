"""The bandgate consumer library: handlers for priority-banded queues, drained hot first.

```python
from consumers import ConsumerApp, Message, Retry, Reject

app = ConsumerApp()

@app.consumer("orders", concurrency=8)
async def handle(msg: Message) -> None: ...
```
Run it with `bandgate worker module:app`.
"""

from consumers.app import ConsumerApp
from consumers.errors import Reject, Retry
from consumers.message import Message

__all__ = ["ConsumerApp", "Message", "Reject", "Retry"]

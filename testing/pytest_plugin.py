"""pytest fixtures for the in-memory harness, registered with pytest when bandgate is installed
(the `pytest11` entry point `bandgate`).

Define a `bandgate_app` fixture that returns your `ConsumerApp`; `bandgate_harness` is then a
started `Harness` of it, closed after the test. An async fixture: it needs pytest-asyncio (in
its `auto` mode, or a test marked `asyncio`), and without it this plugin offers nothing.

```python
import pytest
from bandgate.consumers import ConsumerApp
from bandgate.testing import Harness
from myapp.worker import app

@pytest.fixture
def bandgate_app() -> ConsumerApp:
    return app

async def test_hot_first(bandgate_harness: Harness) -> None:
    ...
```

examples/test_worker.py is this, whole, for the example worker (docs/guides/testing.md shows
it, and `pytest examples` runs it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # loaded with every pytest session: the worker library only when used
    from bandgate.consumers import ConsumerApp
    from bandgate.testing.harness import Harness


@pytest.fixture
def bandgate_app() -> ConsumerApp:
    """The app under test: override this fixture with your own `ConsumerApp`."""
    raise pytest.UsageError("define a `bandgate_app` fixture that returns your ConsumerApp")


if importlib.util.find_spec("pytest_asyncio") is not None:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def bandgate_harness(bandgate_app: ConsumerApp) -> AsyncIterator[Harness]:
        """A started `Harness` of `bandgate_app`, closed after the test."""
        from bandgate.testing.harness import Harness

        async with Harness(bandgate_app) as harness:
            yield harness

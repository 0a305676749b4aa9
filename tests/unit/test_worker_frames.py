"""`BANDGATE_FAST_FRAMES`: the one process-wide replacement bandgate makes (pamqp's frame
decoder, by `core.protocol.frames`) happens in a worker's process only when the setting is on;
unset, a worker that a program runs itself leaves pamqp alone (`bandgate worker` turns it on:
tests/unit/test_consumer_cli.py)."""

from __future__ import annotations

import pamqp.frame
import pytest

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.errors import ConsumerError
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.protocol import frames


@pytest.mark.parametrize("fast_frames", [True, False, None])
async def test_a_worker_replaces_pamqps_decoder_only_when_fast_frames_is_on(
    fast_frames: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker puts `frames.unmarshal` in place of pamqp's as it starts, before it
    connects (here to a port nobody listens on), or leaves pamqp's alone."""
    monkeypatch.setattr(pamqp.frame, "unmarshal", frames._PAMQP_UNMARSHAL)
    app = ConsumerApp()

    @app.consumer("orders")
    async def handle(message: Message) -> None:
        del message

    settings = WorkerSettings(
        amqp_url="amqp://guest:guest@127.0.0.1:1/",
        connect_timeout_seconds=0,
        fast_frames=fast_frames,
    )
    with pytest.raises(ConsumerError, match="cannot connect"):
        await Worker(app, settings=settings).run()
    assert (pamqp.frame.unmarshal is frames.unmarshal) is bool(fast_frames)

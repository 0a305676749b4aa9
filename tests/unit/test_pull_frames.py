"""`BANDGATE_PULL_FAST_FRAMES`: the HTTP receivers put bandgate's frame decoder in place of
pamqp's (as `bandgate worker` does, tests/unit/test_worker_frames.py) only when the setting is
on, and `bandgate gateway`, whose process is the gateway's alone, turns it on unless told not to."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pamqp.frame
import pytest
from starlette.datastructures import State
from typer.testing import CliRunner

from bandgate.core.protocol import frames
from bandgate.ops.cli import root
from bandgate.pull.app import PullExtension
from bandgate.pull.settings import PullSettings


@pytest.mark.parametrize("fast_frames", [True, False])
async def test_the_receivers_replace_pamqps_decoder_only_when_fast_frames_is_on(
    fast_frames: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pamqp.frame, "unmarshal", frames._PAMQP_UNMARSHAL)
    state = State()
    state.link = SimpleNamespace(publisher=None)
    state.telemetry = None
    state.settings = SimpleNamespace(max_connections=1000, max_body_bytes=256 * 1024)
    await PullExtension(PullSettings(fast_frames=fast_frames)).start(state)
    assert (pamqp.frame.unmarshal is frames.unmarshal) is fast_frames


@pytest.mark.parametrize(
    ("environment", "fast_frames"),
    [({}, "true"), ({"BANDGATE_PULL_FAST_FRAMES": "false"}, "false")],
)
def test_the_gateway_command_opts_into_fast_frames_unless_told_not_to(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], fast_frames: str
) -> None:
    monkeypatch.delenv("BANDGATE_PULL_FAST_FRAMES", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    seen: list[str | None] = []

    def run(*args: Any, **kwargs: Any) -> None:
        seen.append(os.environ.get("BANDGATE_PULL_FAST_FRAMES"))

    monkeypatch.setattr("bandgate.ops.cli.uvicorn.run", run)
    result = CliRunner().invoke(root, ["gateway"])
    assert result.exit_code == 0, result.output
    assert seen == [fast_frames]
    assert PullSettings().fast_frames is (fast_frames == "true")

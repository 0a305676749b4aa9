"""The gateway with HTTP receivers: what `bandgate gateway` and `bandgate dev` serve.

The gateway (`bandgate.gateway`) knows nothing of consumers; this floor, above both, plugs
the receivers into it as an `Extension`.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.routing import BaseRoute

from bandgate.core.protocol import frames
from bandgate.core.telemetry import Telemetry
from bandgate.gateway.app import create_app as create_gateway
from bandgate.gateway.settings import GatewaySettings
from bandgate.pull import routes
from bandgate.pull.openapi import document
from bandgate.pull.service import Receivers
from bandgate.pull.settings import PullSettings
from bandgate.topology.model import Topology


class PullExtension:
    def __init__(self, settings: PullSettings | None = None) -> None:
        self.settings = settings or PullSettings()
        self.receivers: Receivers | None = None

    def routes(self) -> list[BaseRoute]:
        return routes.routes()

    async def start(self, state: State) -> None:
        if self.settings.fast_frames:
            frames.install()  # deliveries' frames read without pamqp's generic decoding
        self.receivers = Receivers(
            state.link,
            self.settings,
            state.telemetry,
            state.settings.max_connections,
            state.settings.max_body_bytes,
        )
        state.receivers = self.receivers

    def document(self, openapi: dict[str, Any]) -> None:
        document(openapi, self.settings)

    def readiness(self) -> dict[str, Any]:
        """Whether the receivers follow the tombstone ledger (they start at the first
        receive): one that cannot read it leases cancelled copies, and must say so."""
        ledger = self.receivers.ledger if self.receivers is not None else None
        if ledger is None:
            return {"ledger": "not read yet (from the first receive on)"}
        return {"ledger": "following" if ledger.following else ledger.problem}

    async def close(self) -> None:
        if self.receivers is not None:
            await self.receivers.close()


def create_app(
    settings: GatewaySettings | None = None,
    topology: Topology | None = None,
    connect_wait: float = 5.0,
    telemetry: Telemetry | None = None,
    pull: PullSettings | None = None,
) -> Starlette:
    """The gateway app (`bandgate.gateway.app.create_app`), serving HTTP receivers too."""
    return create_gateway(
        settings, topology, connect_wait, telemetry, extensions=[PullExtension(pull)]
    )


__all__ = ["PullExtension", "create_app"]

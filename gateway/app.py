"""The Starlette app factory. The lifespan owns every resource: settings, topology and the
broker link; nothing connects or reads the environment at import time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route

from bandgate.core import error_codes
from bandgate.core.broker import BrokerLink
from bandgate.core.heap import freeze_startup_heap
from bandgate.core.telemetry import Telemetry
from bandgate.gateway import log_lines
from bandgate.gateway.api_docs import docs_routes
from bandgate.gateway.auth import Authenticator, AuthMiddleware
from bandgate.gateway.budgets import Seats, Window
from bandgate.gateway.console import console_routes
from bandgate.gateway.cross_site import CrossSiteGuard
from bandgate.gateway.dlq_routes import dlq_routes, finish_dead_letter_work
from bandgate.gateway.errors import ApiError, api_error_handler, http_error_handler
from bandgate.gateway.message_routes import message_routes
from bandgate.gateway.middleware import BodyLimitMiddleware, ErrorBoundary, Utf8PathMiddleware
from bandgate.gateway.publish_lane import PublishLane
from bandgate.gateway.routes import routes
from bandgate.gateway.settings import GatewaySettings
from bandgate.topology.model import Topology

log = logging.getLogger(__name__)


class Extension(Protocol):
    """A surface a higher floor serves from the gateway's process (`bandgate.pull`), so that
    the gateway itself never imports it: its routes, what it adds to the OpenAPI document,
    and what it must close before the broker link does."""

    def routes(self) -> list[BaseRoute]:
        """Its routes, tried before all but the gateway's core ones: none may match a
        request that a gateway route matches (`tests/unit/test_pull_routes.py`)."""
        ...

    async def start(self, state: State) -> None:
        """The app starts: `state` holds its settings, topology, broker link and telemetry."""
        ...

    def document(self, openapi: dict[str, Any]) -> None:
        """Add its paths and schemas to the app's OpenAPI document."""
        ...

    def readiness(self) -> dict[str, Any]:
        """What `/readyz` reports about it, beside the broker (it does not make it 503)."""
        ...

    async def close(self) -> None: ...


def create_app(
    settings: GatewaySettings | None = None,
    topology: Topology | None = None,
    connect_wait: float = 5.0,
    telemetry: Telemetry | None = None,
    extensions: Sequence[Extension] = (),
    link: BrokerLink | None = None,
) -> Starlette:
    """Build the gateway. Without arguments, settings come from `BANDGATE_*` (read now) and
    the topology from the settings' file (read when the app starts). `link`: the broker link
    to serve over (and its topology) instead of one to the settings' broker: the in-memory
    harness's (`bandgate.testing.Harness.gateway_link`)."""
    resolved = settings or GatewaySettings()
    metrics = telemetry or Telemetry(resolved.connection_name)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        log_lines.install()  # client text in any log line of this process stays on its line
        model = topology or (link.topology if link else resolved.load_topology())
        serving = link or BrokerLink(
            resolved.amqp_url,
            model,
            connection_name=resolved.connection_name,
            channel_pool_size=resolved.channel_pool_size,
            confirm_timeout=resolved.publish_timeout_seconds,
            declare_topology=resolved.declare_topology,
            management_url=resolved.management_url,
            telemetry=metrics,
            where=resolved.describe_broker(),
        )
        app.state.settings = resolved
        app.state.topology = model
        app.state.link = serving
        app.state.telemetry = metrics
        app.state.authenticator = authenticator
        per_token = resolved.max_dlq_operations_per_token
        app.state.dlq_seats = Seats(
            per_token,
            max(per_token, resolved.max_connections // 4),
            error_codes.TOO_MANY_DLQ_OPERATIONS,
            "dead-letter operations",
        )
        app.state.tombstone_budget = Window(
            resolved.max_tombstones_per_token,
            model.ledger.max_age_seconds,
            error_codes.TOO_MANY_TOMBSTONES,
            "tombstones",
        )
        app.state.extensions = tuple(extensions)
        await serving.start(wait=connect_wait)
        for extension in extensions:
            await extension.start(app.state)
        freeze_startup_heap()
        try:
            yield
        finally:
            await finish_dead_letter_work(app.state)
            for extension in extensions:
                await extension.close()
            await serving.close()
            if telemetry is None:
                metrics.shutdown()

    authenticator = Authenticator(
        resolved.tokens,
        enabled=resolved.auth_enabled,
        rate_per_second=resolved.rate_limit_per_second,
        burst=resolved.rate_limit_burst,
        failures_per_minute=resolved.auth_failures_per_minute,
    )
    if not resolved.auth_enabled:
        log.warning("authentication is disabled: anyone who can reach the gateway may publish")
    guards = [
        Middleware(ErrorBoundary),
        Middleware(
            CrossSiteGuard,
            allowed_hosts=resolved.allowed_hosts,
            allowed_origins=resolved.allowed_origins,
        ),
        Middleware(Utf8PathMiddleware),
        Middleware(AuthMiddleware, authenticator=authenticator),
        Middleware(BodyLimitMiddleware, limit=resolved.max_body_bytes),
    ]
    served = [
        *routes(),
        # The extensions' routes before the gateway's rarer ones: HTTP receivers serve a
        # request per message or batch, and Starlette's router tries the routes in turn
        # (about 1 us each). Their paths are the extension's own: no route matches another's.
        *(route for extension in extensions for route in extension.routes()),
        *message_routes(),
        *dlq_routes(),
        *console_routes(),
        *docs_routes(),
    ]
    # The router's first route is the single publish: the lane takes exactly what it would.
    assert isinstance(served[0], Route)
    return Starlette(
        routes=served,
        middleware=[Middleware(PublishLane, route=served[0], guards=guards), *guards],
        exception_handlers={ApiError: api_error_handler, HTTPException: http_error_handler},
        lifespan=lifespan,
    )

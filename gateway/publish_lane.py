"""The single-message publish's own lane past Starlette's router (issue 35).

`POST /v1/queues/{queue}/messages` is most of what the gateway serves, and Starlette spends a
good part of its CPU per request on layers this route does not need: its exception
middleware, the router's walk, the route's request and exception wrappers. The lane answers
that route with the same guards (the app's own middleware classes, built with the same
arguments, in the same order: error boundary, cross-site, UTF-8 path, auth and rate limit,
body limit), the same route's match (`Route.matches`), the same handler (`routes.publish`)
and the same error handler (`api_error_handler`), so no decision is written twice; every
other request goes the ordinary way.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bandgate.gateway.errors import ApiError, api_error_handler
from bandgate.gateway.routes import publish


class PublishLane:
    """Middleware (the outermost of the app's own): a request the `route` matches fully
    takes the lane, `guards` around the publish handler; any other goes on to `app`."""

    def __init__(self, app: ASGIApp, route: Route, guards: Sequence[Middleware]) -> None:
        if route.endpoint is not publish:
            raise ValueError(f"the publish lane serves routes.publish, not {route.endpoint!r}")
        self.app = app
        self.route = route
        lane: ASGIApp = _serve
        for cls, args, kwargs in reversed(guards):
            lane = cls(lane, *args, **kwargs)
        self.lane = lane

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match, child = self.route.matches(scope)
            if match is Match.FULL:
                scope.update(child)
                await self.lane(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _serve(scope: Scope, receive: Receive, send: Send) -> None:
    """The route's handler, its `ApiError` answered as the app's exception handler does."""
    request = Request(scope, receive, send)
    try:
        response = await publish(request)
    except ApiError as error:
        response = await api_error_handler(request, error)
    await response(scope, receive, send)


__all__ = ["PublishLane"]

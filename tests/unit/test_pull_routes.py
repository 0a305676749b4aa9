"""The receivers' routes come early in the router (`gateway.app.create_app`): that is only
sound while no route of the gateway matches a request one of theirs matches, or the other way
round, so that the order decides nothing."""

from __future__ import annotations

import re

import pytest
from starlette.routing import Match, Route

from bandgate.pull import routes
from bandgate.pull.app import create_app

RECEIVERS = {route.path for route in routes.routes() if isinstance(route, Route)}


def _routes() -> list[Route]:
    return [route for route in create_app().routes if isinstance(route, Route)]


def _sample(route: Route) -> str:
    return re.sub(r"\{[^}]+\}", "x", route.path)


def _requests(route: Route) -> list[tuple[str, str]]:
    return [(method, _sample(route)) for method in sorted(route.methods or ())]


def test_the_receivers_routes_come_right_after_the_gateways_core_ones() -> None:
    paths = [route.path for route in _routes()]
    assert paths.index("/v1/queues/{queue}/receive") < paths.index("/v1/queues/{queue}/dlq")


@pytest.mark.parametrize(
    "route", [route for route in _routes() if route.path in RECEIVERS], ids=lambda r: r.path
)
def test_no_other_route_matches_a_receivers_request_nor_the_other_way(route: Route) -> None:
    others = [other for other in _routes() if other.path not in RECEIVERS]
    for method, path in _requests(route):
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        assert [o.path for o in others if o.matches(scope)[0] is Match.FULL] == []
    for other in others:
        for method, path in _requests(other):
            scope = {"type": "http", "method": method, "path": path, "root_path": ""}
            assert route.matches(scope)[0] is not Match.FULL, (method, path)

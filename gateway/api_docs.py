"""`GET /docs`: the HTTP API reference, rendered in the browser by Redoc from the gateway's own
`/openapi.json`, as FastAPI users expect of `/docs`.

Redoc's bundle is shipped in the package (`docs_assets/`: Redoc 2.5.4's `redoc.standalone.js`
from npm, MIT, with its licence files), so the page loads nothing from a CDN and works offline
and behind a firewall. One change to the bundle: the "API docs by Redocly" badge's logo, which
Redoc loads from cdn.redoc.ly, is `data:,` (an image that fails, so Redoc hides it);
tests/unit/test_api_docs.py checks that no other host is named where a page would load it. Redoc
2 was chosen over 3: 1.1 MB against 2.3 MB, a classic script, and no usage telemetry (3.x
reports to Redocly unless told not to). The page needs no token, as `/openapi.json` does not;
the docs site shows the same page (`tools/mkdocs_hooks.py`).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

BUNDLE = "redoc.standalone.js"
# Redoc styles itself with inline <style> elements and runs its search in a worker made from a
# blob: URL; everything else comes from the gateway itself.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
}


@cache
def asset(name: str) -> bytes:
    """A file of `docs_assets/`, read once."""
    return resources.files("bandgate.gateway").joinpath("docs_assets", name).read_bytes()


async def page(request: Request) -> Response:
    return Response(
        asset("docs.html"),
        media_type="text/html; charset=utf-8",
        headers={**SECURITY_HEADERS, "cache-control": "no-cache"},
    )


async def bundle(request: Request) -> Response:
    # The bundle changes only with the package: a day in the browser's cache is safe.
    return Response(
        asset(BUNDLE),
        media_type="text/javascript; charset=utf-8",
        headers={**SECURITY_HEADERS, "cache-control": "public, max-age=86400"},
    )


# The page renders the API document; it is not an operation of it (as the console is not).
DOCS_PATHS = frozenset({"/docs", f"/docs/{BUNDLE}"})


def docs_routes() -> list[BaseRoute]:
    return [
        Route("/docs", page, methods=["GET"], include_in_schema=False),
        Route(f"/docs/{BUNDLE}", bundle, methods=["GET"], include_in_schema=False),
    ]


__all__ = ["BUNDLE", "DOCS_PATHS", "asset", "docs_routes"]

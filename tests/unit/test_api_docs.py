"""`GET /docs` serves the API reference page and Redoc's bundle from the package itself: both
paths relative (so the page works behind a prefix and as the docs site's copy), no address of
another host in the page, and a policy that lets the page load nothing from elsewhere."""

from __future__ import annotations

import re

import httpx
from starlette.applications import Starlette

from bandgate.gateway.api_docs import BUNDLE, asset, docs_routes


async def get(path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=Starlette(routes=docs_routes()))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        return await client.get(path)


async def test_the_page_renders_the_gateways_own_document_with_the_shipped_bundle() -> None:
    answer = await get("/docs")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/html")
    html = answer.text
    assert re.search(r'<redoc spec-url="openapi\.json"', html)
    assert f'<script src="docs/{BUNDLE}"></script>' in html
    assert "://" not in html  # nothing from another host
    policy = answer.headers["content-security-policy"]
    assert "default-src 'self'" in policy
    assert "http" not in policy


async def test_the_bundle_is_redoc_2_with_its_licence() -> None:
    answer = await get(f"/docs/{BUNDLE}")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/javascript")
    assert answer.content == asset(BUNDLE)
    assert len(answer.content) > 500_000
    notices = asset("redoc.standalone.js.LICENSE.txt").decode()
    assert 'Version: "2.5.4"' in notices
    assert "MIT" in asset("REDOC-LICENSE.txt").decode()


def test_the_bundle_loads_nothing_from_another_host() -> None:
    """Redoc 2.5.4 names one: its badge's logo on cdn.redoc.ly, replaced by `data:,`."""
    code = asset(BUNDLE).decode()
    assert "cdn.redoc.ly" not in code
    assert 'alt:"redocly logo",onError:()=>t(!1),src:"data:,"' in code
    loaded = re.findall(r'(?:src|href):"(https?://[^"]+)"', code)
    assert all(url.startswith("https://redocly.com/") for url in loaded), loaded  # links only


def test_the_docs_site_renders_the_document_the_gateway_serves() -> None:
    """tools/mkdocs_hooks.py: the site's reference/api/ is the gateway's own page and bundle,
    over the document a gateway with the HTTP receivers serves."""
    import json

    from tools.mkdocs_hooks import api_reference_files

    files = api_reference_files()
    assert files["reference/api/index.html"] == asset("docs.html")
    assert files[f"reference/api/docs/{BUNDLE}"] == asset(BUNDLE)
    paths = json.loads(files["reference/api/openapi.json"])["paths"]
    assert "/v1/queues/{queue}/messages" in paths
    assert "/v1/queues/{queue}/receive" in paths  # the receivers' operations too

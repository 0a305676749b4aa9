"""`/docs` of a running gateway, in Debian's headless Chromium: Redoc renders the gateway's own
`/openapi.json` (every operation listed, the receivers' included), and the page asks nothing of
any other host, nor breaks its own content security policy."""

from __future__ import annotations

from urllib.parse import urlsplit

from playwright.async_api import ConsoleMessage, Page, Request, expect

from bandgate.gateway.openapi import openapi_document
from tests.browser.conftest import ARTIFACTS
from tests.integration.live_gateway import LiveGateway


async def test_docs_renders_the_served_document_from_the_gateway_alone(
    live: LiveGateway, page: Page
) -> None:
    origin = urlsplit(live.url).netloc
    hosts: list[str] = []
    errors: list[str] = []

    def asked(request: Request) -> None:
        url = urlsplit(request.url)
        if url.scheme not in ("blob", "data"):  # Redoc's search worker; its emptied logo
            hosts.append(url.netloc)

    def said(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("request", asked)
    page.on("console", said)
    await page.goto(f"{live.url}/docs")
    publish = openapi_document()["paths"]["/v1/queues/{queue}/messages"]["post"]["summary"]
    await expect(page.get_by_text(publish).first).to_be_visible(timeout=30_000)
    # The HTTP receivers' operations are in the served document too.
    await expect(page.get_by_text("/v1/queues/{queue}/receive").first).to_be_attached()
    await page.screenshot(path=ARTIFACTS / "api-docs.png")
    assert hosts
    assert set(hosts) == {origin}, hosts
    assert not [e for e in errors if "Content Security Policy" in e], errors

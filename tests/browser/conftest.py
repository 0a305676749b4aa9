"""A real gateway on a port, with tokens, and Debian's headless Chromium driven by Playwright.

Playwright's own browser download cannot run here (nor in CI): `.ci/run` installs Debian's
`chromium`, and the tests launch `/usr/bin/chromium`. Screenshots go to `ARTIFACTS`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Page, async_playwright

from bandgate.gateway.auth import TokenSpec, hash_token
from bandgate.gateway.settings import GatewaySettings
from bandgate.ops.local_broker import free_port
from bandgate.topology.model import Topology
from tests.broker import TestBroker
from tests.conftest import ROOT
from tests.integration.live_gateway import LiveGateway

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
ARTIFACTS = ROOT / ".bandgate" / "test-artifacts" / "browser"

ADMIN = "console-admin-secret"
READER = "console-reader-secret"
PUBLISHER = "console-publisher-secret"
TOKENS = (
    TokenSpec(name="ops", sha256=hash_token(ADMIN), scopes=("admin",)),
    TokenSpec(name="dashboard", sha256=hash_token(READER), scopes=("read:orders",)),
    TokenSpec(name="app", sha256=hash_token(PUBLISHER), scopes=("publish:*",)),
)


@pytest.fixture
def live(broker: TestBroker, amqp_url: str, topology: Topology) -> Iterator[LiveGateway]:
    """The gateway as `bandgate gateway` serves it, authentication on (it applies the
    topology when it starts)."""
    settings = GatewaySettings(
        amqp_url=amqp_url,
        management_url=broker.management_url,
        port=free_port(),
        tokens=TOKENS,
    )
    with LiveGateway(settings, topology) as gateway:
        yield gateway


@pytest.fixture
async def amqp(amqp_url: str) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(amqp_url)
    async with connection:
        yield connection


@pytest.fixture
def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return CHROMIUM


@pytest.fixture
async def page(chromium: Path) -> AsyncIterator[Page]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(chromium), args=CHROMIUM_ARGS
        )
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            tab = await context.new_page()
            tab.set_default_timeout(15_000)
            yield tab
        finally:
            await browser.close()


async def sign_in(page: Page, gateway: LiveGateway, token: str) -> None:
    """Open the console and paste a token, as an operator does."""
    await page.goto(f"{gateway.url}/console")
    await page.fill("#token", token)
    await page.click("#login button[type=submit]")

"""The console in a real browser: what an operator sees and does, checked against what the
broker holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Page, expect

from bandgate.consumers import ConsumerApp, Message
from bandgate.consumers.settings import WorkerSettings
from bandgate.consumers.worker import Worker
from bandgate.core.publishing import ChannelSet, Publisher, confirm_channel_factory
from bandgate.topology.model import Topology
from tests.browser.conftest import ADMIN, ARTIFACTS, PUBLISHER, READER, sign_in
from tests.conftest import ROOT
from tests.integration.live_gateway import LiveGateway
from tests.integration.test_dead_letters import SAMPLES, dead_letter, depths_settle

pytestmark = [pytest.mark.integration, pytest.mark.browser]

PUBLISHED = {"hot": (8, 2), "warm": (5, 3), "cold": (1, 4)}  # band: (priority, how many)


async def dead_letter_samples(amqp: AbstractRobustConnection, topology: Topology) -> None:
    """The five dead letters of the DLQ tests, as a worker writes them."""
    channels = ChannelSet(confirm_channel_factory(amqp), size=1)
    publisher = Publisher(topology, channels)
    for sample in SAMPLES:
        await dead_letter(publisher, sample)
    await channels.close()
    await depths_settle(amqp, topology, {"orders.dlq": len(SAMPLES)})


def band_cell(page: Page, band: str, column: str) -> str:
    return f'#q-orders tr[data-band="{band}"] td.{column}'


async def test_the_console_shows_each_band_with_its_counts(live: LiveGateway, page: Page) -> None:
    async with httpx.AsyncClient(
        base_url=live.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        for priority, count in PUBLISHED.values():
            for _ in range(count):
                response = await http.post(
                    "/v1/queues/orders/messages", json={"payload": {}, "priority": priority}
                )
                assert response.status_code == 201, response.text

    await sign_in(page, live, ADMIN)
    for band, (_, count) in PUBLISHED.items():
        await expect(page.locator(band_cell(page, band, "ready"))).to_have_text(str(count))
        await expect(page.locator(band_cell(page, band, "consumers"))).to_have_text("0")
        # Nothing drains the band, so its wait is the backlog's age, drawn on the chart.
        await expect(page.locator(f'#q-orders polyline[data-band="{band}"]')).to_have_count(1)
    await expect(page.locator("#q-emails")).to_be_visible()
    await expect(page.locator("#whoami")).to_have_text("token: ops")
    await page.screenshot(path=ARTIFACTS / "console-bands.png", full_page=True)


async def publish_backlog(gateway: LiveGateway, per_band: int) -> None:
    async with httpx.AsyncClient(
        base_url=gateway.url, headers={"authorization": f"Bearer {ADMIN}"}
    ) as http:
        for priority, _ in PUBLISHED.values():
            for _ in range(0, per_band, 50):
                batch = [{"payload": {"n": n}, "priority": priority} for n in range(50)]
                response = await http.post(
                    "/v1/queues/orders/messages/batch", json={"messages": batch}
                )
                assert response.status_code == 200, response.text
                assert not response.json()["failed"]


async def test_the_wait_chart_moves_while_a_worker_drains_a_backlog(
    live: LiveGateway,
    page: Page,
    amqp_url: str,
    topology: Topology,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
) -> None:
    await publish_backlog(live, per_band=100)
    await sign_in(page, live, ADMIN)
    hot_line = page.locator('#q-orders polyline[data-band="hot"]')
    await expect(page.locator(band_cell(page, "cold", "ready"))).to_have_text("100")
    await expect(hot_line).to_have_count(1)
    before = await hot_line.get_attribute("points")

    app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=topology)

    @app.consumer("orders", concurrency=1)
    async def slow(msg: Message) -> None:
        await asyncio.sleep(0.04)

    await start_worker(app)
    await expect(page.locator(band_cell(page, "hot", "consumers"))).to_have_text("1")
    await expect(page.locator(band_cell(page, "hot", "ready"))).to_have_text("0")
    # Hot drained first; warm and cold wait their turn (the README shows this picture).
    await expect(page.locator(band_cell(page, "cold", "ready"))).not_to_have_text("0")
    await page.screenshot(path=ARTIFACTS / "console-draining.png")
    await expect(page.locator(band_cell(page, "cold", "ready"))).to_have_text("0", timeout=60_000)
    assert await hot_line.get_attribute("points") != before


def test_the_readme_screenshot_is_the_console() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "![The bandgate console](docs/console.png)" in readme
    assert (ROOT / "docs" / "console.png").read_bytes().startswith(b"\x89PNG")


async def test_replaying_selected_dead_letters_puts_them_back_in_their_bands(
    live: LiveGateway, page: Page, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await dead_letter_samples(amqp, topology)
    await sign_in(page, live, ADMIN)
    dlq = page.locator("#q-orders .dlq")
    await dlq.locator("button.list").click()
    await expect(dlq.locator("tbody tr")).to_have_count(5)
    await expect(dlq.locator('tr[data-id="d-1"]')).to_contain_text("Reject: bad order")
    await dlq.locator("input.reason").fill("rejected")
    await dlq.locator("button.list").click()
    await expect(dlq.locator("tbody tr")).to_have_count(2)  # filtered by reason
    await dlq.locator("input.reason").fill("")
    await dlq.locator("button.list").click()
    await expect(dlq.locator("tbody tr")).to_have_count(5)

    for message_id in ("d-0", "d-1", "d-2"):  # hot, warm, cold
        await dlq.locator(f'tr[data-id="{message_id}"] input.pick').check()
    await dlq.locator("button.replay-selected").click()
    await expect(dlq.locator(".replay-status")).to_have_attribute("data-done", "true")
    await expect(dlq.locator(".replay-status")).to_contain_text("replayed 3")
    await expect(dlq.locator("progress")).to_have_attribute("value", "3")
    await expect(dlq.locator("tbody tr")).to_have_count(2)  # the page listed again
    await page.screenshot(path=ARTIFACTS / "console-replayed.png", full_page=True)

    expected = {"orders.dlq": 2, "orders.hot": 1, "orders.warm": 1, "orders.cold": 1}
    depths = await depths_settle(amqp, topology, expected)
    assert {name: depths[name] for name in expected} == expected


async def test_purge_needs_the_queue_name_typed(
    live: LiveGateway, page: Page, amqp: AbstractRobustConnection, topology: Topology
) -> None:
    await dead_letter_samples(amqp, topology)
    await sign_in(page, live, ADMIN)
    dlq = page.locator("#q-orders .dlq")
    purge = dlq.locator("button.purge")
    await expect(purge).to_be_disabled()
    await dlq.locator("input.purge-confirm").fill("order")
    await expect(purge).to_be_disabled()
    await purge.dispatch_event("click")  # a click that slips past the disabled button
    assert (await depths_settle(amqp, topology, {"orders.dlq": 5}))["orders.dlq"] == 5
    await page.screenshot(path=ARTIFACTS / "console-purge-unconfirmed.png", full_page=True)

    await dlq.locator("input.purge-confirm").fill("orders")
    await expect(purge).to_be_enabled()
    await purge.click()
    await expect(dlq.locator(".replay-status")).to_contain_text("purged 5")
    assert (await depths_settle(amqp, topology, {"orders.dlq": 0}))["orders.dlq"] == 0


async def test_a_publish_only_token_is_refused(live: LiveGateway, page: Page) -> None:
    await sign_in(page, live, PUBLISHER)
    await expect(page.locator("body")).to_have_attribute("data-refused", "403")
    await expect(page.locator("#notice")).to_contain_text("may read no queue")
    await expect(page.locator("section.queue")).to_have_count(0)
    await page.screenshot(path=ARTIFACTS / "console-refused.png", full_page=True)
    async with httpx.AsyncClient(base_url=live.url) as http:
        publisher = {"authorization": f"Bearer {PUBLISHER}"}
        assert (await http.get("/v1/console/overview", headers=publisher)).status_code == 403
        replay = await http.post("/v1/console/queues/orders/dlq/replay", headers=publisher)
        assert replay.status_code == 403
        assert (await http.get("/v1/console/overview")).status_code == 401


async def test_a_read_token_sees_its_queue_without_dead_letter_actions(
    live: LiveGateway, page: Page
) -> None:
    await sign_in(page, live, READER)
    await expect(page.locator(band_cell(page, "hot", "ready"))).to_have_text("0")
    await expect(page.locator("section.queue")).to_have_count(1)  # orders, not emails
    await expect(page.locator("#q-orders .dlq")).to_have_count(0)

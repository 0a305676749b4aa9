"""The console in a real browser: what an operator sees and does, checked against what the
broker holds."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Locator, Page, expect
from prometheus_client.parser import text_string_to_metric_families

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
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}


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
    async with httpx.AsyncClient(base_url=live.url, headers=AS_ADMIN) as http:
        for priority, count in PUBLISHED.values():
            for _ in range(count):
                response = await http.post(
                    "/v1/queues/orders/messages", json={"payload": {}, "priority": priority}
                )
                assert response.status_code == 201, response.text
        response = await http.post(
            "/v1/queues/orders/messages", json={"payload": {}, "delay_seconds": 120}
        )
        assert response.status_code == 201, response.text

    await sign_in(page, live, ADMIN)
    await expect(page.locator("body")).to_have_attribute("data-loaded", "true")
    # The first sample, moments after the gateway declared the bands: the management API has
    # not sampled them yet, and unacked is a count all the same.
    for band in PUBLISHED:
        assert await page.locator(band_cell(page, band, "unacked")).text_content() == "0"
    # A backlog the gateway has just found is not "0 ms" old: it does not know how old it is,
    # then it knows a lower bound.
    cold_wait = page.locator(band_cell(page, "cold", "wait"))
    assert await cold_wait.text_content() == "new backlog, age unknown"
    await expect(cold_wait).to_have_text(re.compile(r"^≥ \d+(\.\d)? s \(backlog\)$"))
    for band, (_, count) in PUBLISHED.items():
        await expect(page.locator(band_cell(page, band, "ready"))).to_have_text(str(count))
        await expect(page.locator(band_cell(page, band, "consumers"))).to_have_text("0")
        # Nothing drains the band, so its wait is the backlog's age, drawn on the chart.
        await expect(page.locator(f'#q-orders polyline[data-band="{band}"]')).to_have_count(1)
    await expect(page.locator("#q-emails")).to_be_visible()
    await expect(page.locator("#whoami")).to_have_text("token: ops")
    # The delay ladder is every queue's: its count shows once, for the deployment.
    await expect(page.locator("#deployment .delayed")).to_have_text("1")
    await expect(page.locator("#deployment")).to_contain_text("all queues")
    await expect(page.locator("section.queue .summary .delayed")).to_have_count(0)
    await expect(page.locator("#q-emails .summary")).not_to_contain_text("delayed")
    await page.screenshot(path=ARTIFACTS / "console-bands.png", full_page=True)


async def line_style(line: Locator) -> tuple[str | None, str | None, str | None]:
    return (
        await line.get_attribute("stroke"),
        await line.get_attribute("stroke-dasharray"),
        await line.get_attribute("stroke-width"),
    )


async def band_styles(page: Page, queue: str) -> dict[str, tuple[str | None, ...]]:
    """Each band's table swatch colour, legend swatch and chart line of one queue."""
    styles: dict[str, tuple[str | None, ...]] = {}
    for row in await page.locator(f"#q-{queue} table.bands tbody tr").all():
        band = await row.get_attribute("data-band")
        assert band is not None
        swatch = await row.locator(".swatch").get_attribute("data-color")
        legend = await line_style(page.locator(f'#q-{queue} .legend-item[data-band="{band}"] line'))
        chart = await line_style(page.locator(f'#q-{queue} polyline[data-band="{band}"]'))
        assert legend == chart, f"{queue}.{band}: the legend's swatch is not the line's"
        assert swatch == legend[0], f"{queue}.{band}: the table's swatch is another colour"
        styles[band] = legend
    return styles


async def test_bands_have_one_colour_per_temperature_and_lines_stay_apart(
    live: LiveGateway, page: Page
) -> None:
    await sign_in(page, live, ADMIN)
    for queue, bands in (("orders", 3), ("emails", 2)):
        # Empty bands: flat lines at 0, on top of each other.
        await expect(page.locator(f"#q-{queue} polyline")).to_have_count(bands)
        await expect(page.locator(f"#q-{queue} .legend-item line")).to_have_count(bands)
    orders = await band_styles(page, "orders")
    emails = await band_styles(page, "emails")
    # emails has hot and cold only: its cold band is the coldest's colour, as orders' cold is.
    assert emails["hot"] == orders["hot"]
    assert emails["cold"] == orders["cold"]
    assert len({style[0] for style in orders.values()}) == 3
    # Lines that coincide are told apart by dash and width, not by colour alone.
    assert len({style[1:] for style in orders.values()}) == 3
    assert orders["hot"][1] is None  # the hottest solid
    await expect(page.locator('#q-orders .legend-item[data-band="warm"]')).to_have_text("warm")
    await page.locator("#q-emails").scroll_into_view_if_needed()
    await page.screenshot(path=ARTIFACTS / "console-colours.png", full_page=True)


async def test_the_first_stats_after_start_count_unacked(live: LiveGateway) -> None:
    """Asked moments after the gateway declared the topology, before the management API's
    statistics database sampled the bands (5-10 s): unacked is a count, not null."""
    async with httpx.AsyncClient(base_url=live.url, headers=AS_ADMIN) as http:
        orders = (await http.get("/v1/queues/orders/stats")).json()
        emails = (await http.get("/v1/queues/emails/stats")).json()
    assert [band["unacked"] for band in orders["bands"]] == [0, 0, 0]  # quorum
    assert [band["unacked"] for band in emails["bands"]] == [0, 0]  # quorum, classic


async def publish_backlog(gateway: LiveGateway, per_band: int) -> None:
    async with httpx.AsyncClient(base_url=gateway.url, headers=AS_ADMIN) as http:
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
    # 100 messages of 40 ms: about 4 s, more on a busy machine (expect's default is 5 s).
    await expect(page.locator(band_cell(page, "hot", "ready"))).to_have_text("0", timeout=20_000)
    # Hot drained first; warm and cold wait their turn (the docs show this picture).
    await expect(page.locator(band_cell(page, "cold", "ready"))).not_to_have_text("0")
    # The delivery rate is the management API's: it shows once its statistics sampled the
    # deliveries (every 5 s).
    out = page.locator("#q-orders .summary .out b")
    await expect(out).not_to_have_text(re.compile(r"^(–|0\.0/s)$"), timeout=20_000)
    await page.screenshot(path=ARTIFACTS / "console-draining.png")
    await expect(page.locator(band_cell(page, "cold", "ready"))).to_have_text("0", timeout=60_000)
    assert await hot_line.get_attribute("points") != before


def test_the_docs_screenshot_is_the_console() -> None:
    page = (ROOT / "docs" / "guides" / "observability.md").read_text()
    assert "![The bandgate console](../console.png)" in page
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
    await expect(page.locator("#q-orders .message-actions")).to_have_count(0)  # no publish:


async def test_a_wrong_token_is_told_apart_from_a_missing_one(
    live: LiveGateway, page: Page
) -> None:
    await sign_in(page, live, "not-a-token-of-this-gateway")
    await expect(page.locator("body")).to_have_attribute("data-code", "invalid_token")
    await expect(page.locator("body")).to_have_attribute("data-refused", "401")
    await expect(page.locator("#notice")).to_contain_text("invalid token")
    await expect(page.locator("section.queue")).to_have_count(0)
    await page.screenshot(path=ARTIFACTS / "console-invalid-token.png")

    await sign_in(page, live, "")  # no token at all
    await expect(page.locator("body")).to_have_attribute("data-code", "unauthorized")
    await expect(page.locator("#notice")).to_have_text("paste a token with read:<queue> or admin")

    await sign_in(page, live, READER)
    await expect(page.locator("body")).to_have_attribute("data-loaded", "true")
    await expect(page.locator("body")).not_to_have_attribute("data-refused", re.compile(".*"))
    await expect(page.locator("#notice")).not_to_contain_text("token")


def consumed(worker: Worker, outcome: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(worker.telemetry.prometheus_text().decode())
        for sample in family.samples
        if sample.name == "bandgate_consumed_total" and sample.labels.get("outcome") == outcome
    )


async def settled(worker: Worker, expected: dict[str, float], seconds: float = 30) -> None:
    """Wait until the worker counted `expected` outcomes (a metric: nothing to await)."""
    deadline = time.monotonic() + seconds
    while any(consumed(worker, outcome) < count for outcome, count in expected.items()):
        assert time.monotonic() < deadline, f"not settled: {expected}"
        await asyncio.sleep(0.05)


async def act_on(page: Page, action: str, message_id: str, body: str | None = None) -> Locator:
    """Fill the queue's by-id form and press `action`; the result line."""
    form = page.locator("#q-orders .message-actions")
    await form.locator("input.message-id").fill(message_id)
    if body is not None:
        await form.locator("textarea.message-body").fill(body)
    await form.locator(f"button.{action}-message").click()
    return form.locator(".message-result")


async def test_cancel_replace_and_escalate_by_id_change_what_the_broker_holds(
    live: LiveGateway,
    page: Page,
    amqp: AbstractRobustConnection,
    amqp_url: str,
    topology: Topology,
    start_worker: Callable[[ConsumerApp], Awaitable[Worker]],
) -> None:
    async with httpx.AsyncClient(base_url=live.url, headers=AS_ADMIN) as http:
        for message_id, priority in (("c-1", 5), ("r-1", 1), ("e-1", 1)):
            body = {"payload": {"v": 1}, "priority": priority, "message_id": message_id}
            response = await http.post("/v1/queues/orders/messages", json=body)
            assert response.status_code == 201, response.text
    await sign_in(page, live, ADMIN)

    result = await act_on(page, "cancel", "c-1")
    await expect(result).to_have_attribute("data-status", "202")
    await expect(result).to_contain_text("cancelled c-1")
    result = await act_on(page, "replace", "r-1", '{"payload": {"v": 2}, "priority": 8}')
    await expect(result).to_have_attribute("data-status", "201")
    await expect(result).to_contain_text("replaced r-1: now priority 8 in band hot")
    # Escalate sends the message again: without its payload the API's refusal is shown.
    await page.locator("#q-orders select.escalate-to").select_option("band:hot")
    result = await act_on(page, "escalate", "e-1", "{}")
    await expect(result).to_have_attribute("data-status", "422")
    await expect(result).to_have_attribute("data-code", "message_required")
    await expect(result).to_contain_text("422 message_required: escalate publishes")
    result = await act_on(page, "escalate", "e-1", '{"payload": {"v": 2}}')
    await expect(result).to_have_attribute("data-status", "201")
    await expect(result).to_contain_text("escalated e-1: now priority 9 in band hot")
    await expect(page.locator(band_cell(page, "hot", "ready"))).to_have_text("2")
    await page.locator("#q-orders .message-actions").scroll_into_view_if_needed()
    await page.screenshot(path=ARTIFACTS / "console-by-id.png")

    # The new generations are in the hot band; the older copies stay where they were, dead.
    expected = {"orders.hot": 2, "orders.warm": 1, "orders.cold": 2}
    depths = await depths_settle(amqp, topology, expected)
    assert {name: depths[name] for name in expected} == expected

    handled: list[tuple[str, str, Any]] = []
    app = ConsumerApp(WorkerSettings(amqp_url=amqp_url), topology=topology)

    @app.consumer("orders", concurrency=1)
    async def record(msg: Message) -> None:
        handled.append((msg.message_id, msg.band, msg.payload))

    worker = await start_worker(app)
    await settled(worker, {"ack": 2, "cancelled": 1, "superseded": 2})
    assert sorted(handled) == [("e-1", "hot", {"v": 2}), ("r-1", "hot", {"v": 2})]


async def test_a_token_without_publish_gets_the_apis_refusal_in_the_form(
    live: LiveGateway, page: Page
) -> None:
    """The form is shown to tokens that may publish; a token whose scope changes under it
    (here: the page told it may, the route says no) sees the route's 403 and code."""
    await sign_in(page, live, ADMIN)
    await expect(page.locator("#q-orders .message-actions")).to_have_count(1)
    await page.evaluate(f"sessionStorage.setItem('bandgate.token', {READER!r})")
    result = await act_on(page, "cancel", "c-1")
    await expect(result).to_have_attribute("data-status", "403")
    await expect(result).to_contain_text("403 forbidden: token 'dashboard' lacks scope")

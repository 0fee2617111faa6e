"""The incident pages in a real browser: Debian's chromium, headless, against the bot with a real SQLite store, fed
as Alertmanager feeds it. The page shows what the card says, its table sorts, filters and pages through the
incident's alerts, it follows the incident as alerts join, are acknowledged and resolve, and nothing is shown
without a credential. Every page is watched for dialogs, console errors and script errors."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page, expect
from playwright.async_api import Error as PlaywrightError

from bot.incident.record import IncidentAdvance
from bot.storage.pages import AlertQuery
from tests.support.bot import eventually, running_bot
from tests.support.browser import watched_page
from tests.support.pages import (
    ANALYSIS,
    CREDENTIALS,
    GPUS,
    basic_header,
    host_alerts,
    pages_config,
    post,
    the_incident,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

HOSTS = 30
WAIT = 30_000  # ms: how long the browser waits for what the page must come to show


async def test_the_page_shows_the_cards_findings_and_its_table_sorts_filters_and_pages(
    tmp_path: Path, browser: Browser
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    async with running_bot(tmp_path, pages_config(tmp_path)) as bot:
        for host in range(HOSTS):
            await post(bot, host_alerts(host, started))
        incident_id = await the_incident(bot.runtime.store, HOSTS * GPUS)
        await bot.runtime.store.advance_incidents({incident_id: IncidentAdvance(ANALYSIS)})
        async with watched_page(browser, http_credentials=CREDENTIALS) as watched:
            page = watched.page
            await page.goto(f"{bot.url}/pages/incidents")
            await page.get_by_role("link", name="GPUTempCritical").click()
            await page.wait_for_selector("body[data-ready='1']")
            assert page.url == f"{bot.url}/pages/incidents/{incident_id}?sort=value&order=desc&page=1"
            # What the card says: scope, what the hosts share, what moved, the likely cause and its first action.
            await expect(page.locator("h1")).to_contain_text(f"Facility cooling on {HOSTS} hosts")
            await expect(page.locator("#summary")).to_contain_text(f"{HOSTS * GPUS} alerts on {HOSTS} of 1,000 hosts")
            await expect(page.locator("#traits")).to_contain_text('48 of 50 affected hosts have row="C"')
            await expect(page.locator("#signals")).to_contain_text("inlet temperature moved +9.0 °C on 47 of 50")
            await expect(page.locator("#signals")).to_contain_text("InletTemperatureHigh firing on 12 hosts")
            await expect(page.locator("#cause")).to_contain_text("Facility cooling")
            await expect(page.locator("#cause")).to_contain_text("First action: Call the facility team")
            await expect(page.locator("#timeline")).to_contain_text("Told as one incident")
            heat_map = page.locator("#summary img")  # drawn in a process of its own
            await eventually(lambda: heat_map.evaluate("img => img.complete && img.naturalWidth > 0"), timeout=30)
            # One page of 100 rows at a time, the hottest first.
            await expect(page.locator("#count")).to_have_text(f"Alerts 1 to 100 of {HOSTS * GPUS}")
            assert await page.locator("#rows tr").count() == 100
            assert await page.locator("#rows tr:first-child td.value").inner_text() == "96 °C"
            # Sorted by host, both ways.
            await page.get_by_role("button", name="Host").click()
            await expect(page.locator("#rows tr:first-child td.host")).to_have_text("k-ai-000")
            await page.get_by_role("button", name="Host").click()
            await expect(page.locator("#rows tr:first-child td.host")).to_have_text(f"k-ai-{HOSTS - 1:03d}")
            # Paged: the third page holds the last 40.
            await page.get_by_role("button", name="Next").click()
            await page.get_by_role("button", name="Next").click()
            await expect(page.locator("#count")).to_have_text(f"Alerts 201 to {HOSTS * GPUS} of {HOSTS * GPUS}")
            await expect(page.locator("#rows tr")).to_have_count(HOSTS * GPUS - 200)
            await expect(page.get_by_role("button", name="Next")).to_be_disabled()
            # Filtered by host, then by a shared label from what the hosts share.
            await page.get_by_label("Host contains").fill("k-ai-007")
            await page.get_by_role("button", name="Filter").click()
            await expect(page.locator("#count")).to_contain_text(f"of {GPUS} matching")
            assert set(await page.locator("#rows td.host").all_inner_texts()) == {"k-ai-007"}
            await page.get_by_role("link", name="show these alerts").click()
            row_c = sum(1 for host in range(HOSTS) if "ABCD"[host % 4] == "C") * GPUS
            await expect(page.locator("#count")).to_contain_text(f"of {row_c} matching")
            assert all("row=C" in labels for labels in await page.locator("#rows td.labels").all_inner_texts())
            # The table's state is in the address: a reload keeps it.
            await page.reload()
            await page.wait_for_selector("body[data-ready='1']")
            await expect(page.get_by_label("Label")).to_have_value("row=C")
            assert watched.troubles == []


async def test_the_page_follows_the_incident_as_alerts_join_are_acknowledged_and_resolve(
    tmp_path: Path, browser: Browser
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    async with running_bot(tmp_path, pages_config(tmp_path)) as bot:
        for host in range(6):
            await post(bot, host_alerts(host, started))
        incident_id = await the_incident(bot.runtime.store, 6 * GPUS)
        async with watched_page(browser, http_credentials=CREDENTIALS) as watched:
            page = watched.page
            await page.goto(f"{bot.url}/pages/incidents/{incident_id}")
            await page.wait_for_selector("body[data-ready='1']")
            await expect(page.locator("#count")).to_have_text(f"Alerts 1 to {6 * GPUS} of {6 * GPUS}")
            # Two hosts join: the summary and the table follow without a reload.
            for host in (6, 7):
                await post(bot, host_alerts(host, started))
            await expect(page.locator("h1")).to_contain_text("GPUTempCritical on 8 hosts", timeout=WAIT)
            await expect(page.locator("#count")).to_have_text(f"Alerts 1 to {8 * GPUS} of {8 * GPUS}", timeout=WAIT)
            # Someone acknowledges one in Slack: the page shows who.
            [alert] = (await bot.runtime.store.incident_alert_page(incident_id, AlertQuery(per_page=1))).alerts
            assert await bot.runtime.store.ack(alert.key, "alice", datetime.now(UTC))
            await expect(page.locator("#rows td.acked", has_text="alice")).to_have_count(1, timeout=WAIT)
            await expect(page.locator("#timeline")).to_contain_text("Acknowledged by alice", timeout=WAIT)
            # All resolve: the incident is over.
            for host in range(8):
                await post(bot, host_alerts(host, started, status="resolved"))
            await expect(page.locator("h1 .badge")).to_have_text("resolved", timeout=WAIT)
            await expect(page.locator("#summary")).to_contain_text(f"all {8 * GPUS} alerts resolved", timeout=WAIT)
            await expect(page.locator("#rows td.status", has_text="firing")).to_have_count(0, timeout=WAIT)
            assert watched.troubles == []


async def test_nothing_is_shown_without_a_credential(tmp_path: Path, browser: Browser) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    async with running_bot(tmp_path, pages_config(tmp_path)) as bot:
        for host in range(2):
            await post(bot, host_alerts(host, started))
        incident_id = await the_incident(bot.runtime.store, 2 * GPUS)
        base = f"{bot.url}/pages/incidents/{incident_id}"
        for credentials in ({}, {"http_credentials": {"username": "oncall", "password": "wrong"}}):
            async with watched_page(browser, **credentials) as watched:
                shown = await refused_page(watched.page, base)
                assert "k-ai-000" not in shown and incident_id not in shown and "GPUTempCritical" not in shown
        async with httpx.AsyncClient(base_url=bot.url) as client:
            for path in ("", "/alerts", "/version", "/summary", "/heatmap.png"):
                refused = await client.get(f"/pages/incidents/{incident_id}{path}")
                assert refused.status_code == 401 and "k-ai-000" not in refused.text, path
                assert refused.headers["WWW-Authenticate"] == 'Basic realm="gpu-alert-bot"'
            wrong = {"Authorization": "Basic " + base64.b64encode(b"oncall:wrong").decode()}
            refused = await client.get(f"/pages/incidents/{incident_id}", headers=wrong)
            assert refused.status_code == 401 and "k-ai-000" not in refused.text
            assert (await client.get(f"/pages/incidents/{incident_id}", headers=basic_header())).status_code == 200


async def refused_page(page: Page, url: str) -> str:
    """What chromium shows of a page the bot refuses: its 401 answer, or (when chromium gives up on the
    credentials it has, or could not ask anyone for) its own error page."""
    try:
        answer = await page.goto(url)
    except PlaywrightError as exc:
        refusal = str(exc)
        await page.wait_for_url(lambda shown: shown.startswith("chrome-error:"))
    else:
        refusal = f"HTTP {answer.status if answer is not None else 'none'}"
    assert refusal == "HTTP 401" or "ERR_INVALID_AUTH_CREDENTIALS" in refusal
    await page.wait_for_load_state()
    return await page.content()

"""Label and annotation values are data on the pages: markup, an `onerror` attribute, a `javascript:` URL and
10,000-character values are shown as text in chromium, and no script runs (no dialog opens, the console and the
page report no error: a Content-Security-Policy refusal would be one). Checked in the browser, not only in HTML."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from bot.models import alert_key, short_id
from tests.support.bot import running_bot
from tests.support.browser import watched_page
from tests.support.pages import CREDENTIALS, pages_config, post, the_incident
from tests.support.payloads import am_alert, webhook

pytestmark = pytest.mark.asyncio(loop_scope="session")

NAME = 'GPUHot<script>alert("name")</script>'
SCRIPT = '<script>alert("label")</script>'
IMAGE = '"><img src=x onerror=alert("img")>'
LONG = "w" * 10_000
JAVASCRIPT = 'javascript:alert("runbook")'


def hostile_alerts(started: datetime) -> list[dict[str, object]]:
    return [
        am_alert(
            NAME,
            starts_at=started,
            instance=f"k-ai-00{gpu}:9400" if gpu else f"{IMAGE}:9400",
            gpu=str(gpu),
            note=SCRIPT,
            owner=IMAGE,
            long=LONG,
            annotations={
                "summary": f"<b>bold</b> {SCRIPT} ({90 + gpu} °C)",
                "runbook_url": JAVASCRIPT,
                "dashboard_url": " JaVaScRiPt:alert('dashboard')",
                "description": LONG,
            },
        )
        for gpu in range(7)
    ]


async def test_hostile_labels_and_annotations_are_shown_as_text_and_run_no_script(
    tmp_path: Path, browser: Browser
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    alerts = hostile_alerts(started)
    async with running_bot(tmp_path, pages_config(tmp_path)) as bot:
        await post(bot, webhook(alerts, group_key='{}:{alertname="hostile"}'))
        incident_id = await the_incident(bot.runtime.store, len(alerts))
        async with watched_page(browser, http_credentials=CREDENTIALS) as watched:
            page = watched.page
            await page.goto(f"{bot.url}/pages/incidents")
            await expect(page.locator("#incidents")).to_contain_text(NAME)
            await page.goto(f"{bot.url}/pages/incidents/{incident_id}?sort=host&order=asc")
            await page.wait_for_selector("body[data-ready='1']")
            await expect(page.locator("h1")).to_contain_text(f"{NAME} on 7 hosts")
            # The host named by markup is text in its cell, in the hosts' list and in the timeline.
            await expect(page.locator("#rows td.host", has_text=IMAGE)).to_have_count(1)
            await expect(page.locator("#hosts")).to_contain_text(IMAGE)
            labels = await page.locator("#rows td.labels").first.inner_text()
            assert f"note={SCRIPT}" in labels and f"owner={IMAGE}" in labels
            assert await page.locator("#rows td.labels").first.evaluate("td => td.textContent.length") > 10_000
            # An alert's page: the labels and annotations as text, the javascript: URLs as no link.
            hostile = alert_key(alerts[0]["fingerprint"], started)  # type: ignore[arg-type]
            await page.goto(f"{bot.url}/pages/alerts/{short_id(hostile)}")
            await expect(page.locator("h1")).to_contain_text(f"{NAME} on {IMAGE}")
            await expect(page.locator("#labels")).to_contain_text(SCRIPT)
            await expect(page.locator("#annotations")).to_contain_text(JAVASCRIPT)
            assert await page.locator("#annotations a").count() == 0
            assert await page.locator("#annotations").evaluate("t => t.textContent.length") > 10_000
            # Nothing the values held became markup: no injected image, no script, no javascript: link anywhere.
            for shown in (f"/pages/incidents/{incident_id}", f"/pages/alerts/{short_id(hostile)}"):
                await page.goto(bot.url + shown)
                await page.wait_for_selector("body[data-ready='1']")
                assert await page.locator("img[src='x'], b, script:not([src])").count() == 0
                assert await page.locator("a[href^='javascript' i], a[href*='javascript:' i]").count() == 0
            assert watched.troubles == []

"""One incident told by Slack (the fake), email (a real SMTP server) and PagerDuty (the Events API fake), with
`server.public_url` set: the link on its Slack card, in its mail and in its PagerDuty alert's `links` is one
address, and chromium following each opens the incident's page; an alert told on its own links to its alert
page the same way, from its Slack message."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.browser import watched_page
from tests.support.pagerduty_receiver import pagerduty_receiver
from tests.support.pages import CREDENTIALS, GPUS, host_alerts, pages_config, post, the_incident
from tests.support.payloads import am_alert, webhook
from tests.support.slack_receiver import slack_receiver
from tests.test_email import smtp_server

pytestmark = pytest.mark.asyncio(loop_scope="session")

_SLACK_LINK = re.compile(r"<(http://[^|>]+)\|(Incident page|Alert page)>")


def slack_link(slack: FakeSlack, title: str, text: str) -> str | None:
    for message in slack.top_level():
        if title in message.rendered_text():
            found = [m.group(1) for m in _SLACK_LINK.finditer(str(message.all_blocks)) if m.group(2) == text]
            return found[0] if found else None
    return None


async def test_the_cards_mails_and_pagerduty_alerts_link_opens_the_incidents_page(
    tmp_path: Path, browser: Browser
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    with smtp_server("plain") as (smtp_port, mails):
        async with FakeSlack() as slack, FakePagerDuty() as pagerduty:
            mail: dict[str, Any] = {
                "type": "email",
                "name": "mail",
                "to": ["oncall@example.com"],
                "from": "gpu-alert-bot@example.com",
                "smarthost": f"127.0.0.1:{smtp_port}",
                "security": "none",
                "allow_plaintext": True,
            }
            config = {
                **pages_config(tmp_path),
                "receivers": [slack_receiver(tmp_path, slack), mail, pagerduty_receiver(tmp_path, pagerduty)],
                "routing": {"default": ["slack", "mail", "pd"]},
            }
            async with running_bot(tmp_path, config) as bot:
                for host in range(3):
                    await post(bot, host_alerts(host, started))
                alone = am_alert("GPUFellOffTheBus", starts_at=started, instance="k-db-7:9400", gpu="2")
                await post(bot, webhook([alone], group_key='{}:{alertname="GPUFellOffTheBus"}'))
                incident_id = await the_incident(bot.runtime.store, 3 * GPUS)
                page = f"{bot.url}/pages/incidents/{incident_id}"

                card = await eventually(lambda: slack_link(slack, "GPUTempCritical on", "Incident page"), timeout=30)
                [mailed] = await eventually(
                    lambda: [m.mail for m in mails.mails if "GPUTempCritical" in str(m.mail["Subject"])], timeout=30
                )
                triggers = await eventually(
                    lambda: [e for e in pagerduty.accepted("trigger") if e["dedup_key"].startswith("incident:")],
                    timeout=30,
                )
                alert_page = await eventually(lambda: slack_link(slack, "GPUFellOffTheBus", "Alert page"), timeout=30)
                text = next(p for p in mailed.walk() if p.get_content_type() == "text/plain").get_content()
                html = next(p for p in mailed.walk() if p.get_content_type() == "text/html").get_content()
                mail_link = re.search(r'href="([^"]*/pages/incidents/[^"]*)"', html)
                assert mail_link is not None and page in text
                paged = triggers[-1]["links"][0]
                assert paged["text"] == "Incident page"
                assert {card, mail_link.group(1), paged["href"]} == {page}

                for followed in (card, mail_link.group(1), paged["href"]):
                    async with watched_page(browser, http_credentials=CREDENTIALS) as watched:
                        await watched.page.goto(followed)
                        await watched.page.wait_for_selector("body[data-ready='1']")
                        await expect(watched.page.locator("h1")).to_contain_text("GPUTempCritical on 3 hosts")
                        await expect(watched.page.locator("#summary")).to_contain_text(incident_id)
                        assert watched.troubles == []
                async with watched_page(browser, http_credentials=CREDENTIALS) as watched:
                    await watched.page.goto(alert_page)
                    await expect(watched.page.locator("h1")).to_contain_text("GPUFellOffTheBus on k-db-7 GPU 2")
                    assert watched.troubles == []

"""End to end: 1,200 GPUs on 150 hosts cross GPUTempCritical at once, posted to the bot as Alertmanager sends them
(one notification per host), routed to Slack (the fake), email (a real SMTP server, STARTTLS) and PagerDuty (the
Events API fake, 120 events a minute per routing key). Each receiver tells one incident: one card and its thread
in Slack, one mail, one PagerDuty alert. An unrelated alert raised while PagerDuty has the incident's trigger
waiting after a 429 is paged at once: it never waits behind the incident."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.models import alert_key, short_id
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.pagerduty_receiver import pagerduty_receiver
from tests.support.payloads import am_alert, webhook
from tests.support.slack_receiver import slack_receiver
from tests.test_email import Pki, make_pki, smtp_server
from tests.test_email_e2e import email_receiver

pytestmark = pytest.mark.realstack

HOSTS, GPUS = 150, 8
_HOST_LINE = re.compile(r"`(k-ai-\d{3})`")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def hot(host: int, started: datetime) -> dict[str, Any]:
    alerts = [
        am_alert(
            "GPUTempCritical",
            starts_at=started,
            instance=f"k-ai-{host:03d}:9400",
            gpu=str(gpu),
            annotations={"summary": f"GPU {gpu} thermal critical ({93 + (host + gpu) % 3} °C)"},
        )
        for gpu in range(GPUS)
    ]
    return webhook(alerts, group_key=f'{{}}:{{alertname="GPUTempCritical", instance="k-ai-{host:03d}:9400"}}')


def keys(payload: dict[str, Any]) -> list[str]:
    return [alert_key(a["fingerprint"], datetime.fromisoformat(a["startsAt"])) for a in payload["alerts"]]


async def test_a_fleet_incident_is_one_card_one_mail_one_page_and_an_unrelated_alert_is_paged_at_once(
    tmp_path: Path, pki: Pki, slack: FakeSlack
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    storm = [hot(n, started) for n in range(HOSTS)]
    unrelated = webhook(
        [am_alert("GPUFellOffTheBus", starts_at=started, instance="k-db-7:9400", gpu="2")],
        group_key='{}:{alertname="GPUFellOffTheBus"}',
    )
    with smtp_server("starttls", pki.trusted) as (port, mails):
        async with FakePagerDuty() as pagerduty:
            config = {
                "receivers": [
                    slack_receiver(tmp_path, slack),
                    email_receiver(port, pki),
                    pagerduty_receiver(tmp_path, pagerduty, rate_limit_delay="15s"),
                ],
                "routing": {"default": ["slack", "oncall-email", "pd"]},
                "outbox": {"initial_backoff": "50ms", "max_backoff": "200ms"},
            }
            # PagerDuty answers the incident's first trigger 429: its lane waits 15 s, as after a storm of pages.
            pagerduty.fail_next(1, "429")
            async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(base_url=bot.url) as client:
                answers = await asyncio.gather(*(client.post("/alertmanager", json=payload) for payload in storm))
                assert [a.status_code for a in answers] == [200] * HOSTS
                await eventually(lambda: "rate_limited" in [e.outcome for e in pagerduty.events], timeout=30)
                assert (await client.post("/alertmanager", json=unrelated)).status_code == 200

                def paged() -> list[dict[str, Any]]:
                    return [b for b in pagerduty.accepted("trigger") if "GPUFellOffTheBus" in json.dumps(b)]

                await eventually(paged, timeout=15)
                # Paged while the incident's own trigger still waits for its retry: not behind it.
                assert [b for b in pagerduty.accepted("trigger") if "GPUTempCritical" in json.dumps(b)] == []
                await eventually(lambda: len(pagerduty.alerts) == 2, timeout=30)
                card = await eventually(lambda: _card(slack), timeout=30)
                await eventually(lambda: len(_host_lines(slack, card)) == HOSTS, timeout=30)
                listed = await eventually(lambda: _attached(slack, card), timeout=30)
                await eventually(lambda: len(mails.received()) == 2, timeout=30)

    # Slack: one card and its thread; one line per host; every alert's id in the attached list.
    top = slack.top_level()
    assert len(top) == 2 and sum("GPUFellOffTheBus" in m.rendered_text() for m in top) == 1
    assert sorted(_HOST_LINE.search(line).group(1) for line in _host_lines(slack, card)) == [  # type: ignore[union-attr]
        f"k-ai-{n:03d}" for n in range(HOSTS)
    ]
    ids = [short_id(key) for payload in storm for key in keys(payload)]
    assert len(set(ids)) == HOSTS * GPUS and all(i in listed for i in ids)
    posts = [c for c in slack.calls_of("chat.postMessage") if c.ok]
    assert len(posts) <= 1 + 6  # the unrelated alert's message, then at most 6 for the incident
    # Email: one mail for the incident (digests come at most every 5 minutes), one for the unrelated alert.
    subjects = sorted(m.mail["Subject"] for m in mails.received())
    assert sum("GPUTempCritical" in s for s in subjects) == 1 and sum("GPUFellOffTheBus" in s for s in subjects) == 1
    # Its alerts.csv lists every alert, read from the store as the mail was sent (a delivery carries no list).
    [mail] = [m.mail for m in mails.received() if "GPUTempCritical" in m.mail["Subject"]]
    [csv_part] = [part for part in mail.iter_attachments() if part.get_filename() == "alerts.csv"]
    assert all(i in csv_part.get_content() for i in ids)
    # PagerDuty: one alert for the incident (its own dedup_key) and the unrelated one; no page per GPU.
    assert len(pagerduty.alerts) == 2
    assert sum(len(pagerduty.accepted(a)) for a in ("trigger", "acknowledge", "resolve")) <= 4


def _card(slack: FakeSlack) -> Any:
    cards = [m for m in slack.top_level() if "GPUTempCritical on 150 hosts" in m.rendered_text()]
    return cards[0] if len(cards) == 1 else None


def _host_lines(slack: FakeSlack, card: Any) -> list[str]:
    return [
        line for reply in slack.replies(card) for line in reply.rendered_text().splitlines() if _HOST_LINE.search(line)
    ]


def _attached(slack: FakeSlack, card: Any) -> str | None:
    listed = [f for f in slack.files_in_thread(card) if f["name"].endswith(".txt")]
    if not listed:
        return None
    data = slack.uploads[listed[0]["id"]].data
    return None if data is None else data.decode()

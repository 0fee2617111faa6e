"""Every member reaches every receiver: 300 GPUTempCritical alerts on 38 hosts are one incident on PagerDuty (the
Events API fake) and by mail (a real SMTP server); one more on another host a moment later joins it, and both
receivers name that host: PagerDuty in an update of the same alert, the mail in the next digest."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.pagerduty import FakePagerDuty
from tests.support.bot import eventually, running_bot
from tests.support.pagerduty_receiver import pagerduty_receiver
from tests.support.payloads import am_alert, webhook
from tests.test_email import smtp_server

pytestmark = pytest.mark.realstack

LATE = "k-ai-00"


def hot(host: str, gpus: int, started: datetime) -> dict[str, Any]:
    alerts = [
        am_alert(
            "GPUTempCritical",
            starts_at=started,
            host=host,
            instance=f"{host}:9400",
            gpu=str(gpu),
            annotations={"summary": f"GPU {gpu} thermal critical (93 °C)"},
        )
        for gpu in range(gpus)
    ]
    return webhook(alerts, group_key=f'{{}}:{{alertname="GPUTempCritical", host="{host}"}}')


def incident_triggers(pagerduty: FakePagerDuty) -> list[dict[str, Any]]:
    return [t for t in pagerduty.accepted("trigger") if t["dedup_key"].startswith("incident:")]


async def test_a_host_that_joins_late_is_named_to_pagerduty_and_in_the_next_mail(tmp_path: Path) -> None:
    hosts = [f"k-ai-{n:02d}" for n in range(10, 48)]
    started = datetime.now(UTC).replace(microsecond=0)
    flood = [hot(host, 8 if n < 37 else 4, started) for n, host in enumerate(hosts)]
    with smtp_server("plain") as (port, mails):
        async with FakePagerDuty() as pagerduty:
            mail = {
                "type": "email",
                "name": "mail",
                "to": ["oncall@example.com"],
                "from": "bot@example.com",
                "smarthost": f"127.0.0.1:{port}",
                "security": "none",
                "allow_plaintext": True,
                "digest_interval": "2s",
            }
            config = {
                "receivers": [
                    mail,
                    pagerduty_receiver(tmp_path, pagerduty),
                ],
                "routing": {"default": ["mail", "pd"]},
                "outbox": {"initial_backoff": "50ms", "max_backoff": "200ms"},
            }
            async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(base_url=bot.url) as client:
                for payload in flood:
                    assert (await client.post("/alertmanager", json=payload)).status_code == 200
                first = await eventually(
                    lambda: [t for t in incident_triggers(pagerduty) if "38 hosts" in t["payload"]["source"]],
                    timeout=30,
                )
                await eventually(lambda: len(mails.received()) >= 1, timeout=30)
                assert (await client.post("/alertmanager", json=hot(LATE, 1, started))).status_code == 200
                named = await eventually(
                    lambda: [
                        t for t in incident_triggers(pagerduty) if LATE in t["payload"]["custom_details"]["every_host"]
                    ],
                    timeout=30,
                )
                digest = await eventually(
                    lambda: [m.mail for m in mails.received() if LATE in _text(m.mail)], timeout=30
                )
    every_host = named[-1]["payload"]["custom_details"]["every_host"].split(", ")
    assert sorted(every_host) == sorted([*hosts, LATE]) and named[-1]["payload"]["source"] == "39 hosts"
    assert {t["dedup_key"] for t in incident_triggers(pagerduty)} == {first[0]["dedup_key"]}  # one PagerDuty alert
    assert [key for key in pagerduty.alerts if not key.startswith("incident:")] == []  # no page per GPU
    late_mail = digest[0]
    assert "UPDATE" in late_mail["Subject"] and late_mail["In-Reply-To"]  # the incident's thread, its next digest
    [joined] = [line for line in _text(late_mail).splitlines() if line.startswith("Hosts that joined:")]
    assert LATE in joined


def naming(pagerduty: FakePagerDuty, host: str) -> list[dict[str, Any]]:
    return [t for t in incident_triggers(pagerduty) if host in t["payload"]["custom_details"]["every_host"]]


def _text(mail: Any) -> str:
    part = mail.get_body(preferencelist=("plain",))
    return str(part.get_content()) if part is not None else ""

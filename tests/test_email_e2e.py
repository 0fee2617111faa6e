"""End to end: a real Alertmanager fires and resolves through the bot into a real SMTP server (aiosmtpd, STARTTLS);
and with PagerDuty down, the mails of the same alerts still go out."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.pagerduty import FakePagerDuty
from tests.support.bot import eventually, running_bot
from tests.test_email import HOSTILE, Pki, RecordingHandler, make_pki, smtp_server

pytestmark = pytest.mark.realstack

ROUTING_KEY = "0123456789abcdef0123456789abcdef"
FAST_OUTBOX = {"initial_backoff": "50ms", "max_backoff": "200ms"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def quoted(value: str) -> str:
    """A label value for amtool, which parses labels as matchers."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def email_receiver(port: int, pki: Pki) -> dict[str, Any]:
    return {
        "type": "email",
        "name": "oncall-email",
        "to": ["oncall@example.com"],
        "from": "gpu-alert-bot@example.com",
        "smarthost": f"127.0.0.1:{port}",
        "ca_file": str(pki.ca_file),
        "timeout": "5s",
    }


def fire(am: Any, start: str, *labels: str, end: str | None = None) -> None:
    args = ["alert", "add", "GPUXidError", *labels, "--annotation=summary=Xid 79 on GPU 3", f"--start={start}"]
    if end is not None:
        args.append(f"--end={end}")
    am.amtool(*args)


async def test_firing_then_resolve_arrive_as_one_thread(tmp_path: Path, pki: Pki, alertmanager_factory: Any) -> None:
    with smtp_server("starttls", pki.trusted) as (port, handler):
        config = {
            "receivers": [email_receiver(port, pki)],
            "routing": {"default": ["oncall-email"]},
            "outbox": FAST_OUTBOX,
        }
        async with running_bot(tmp_path, config) as bot:
            am = alertmanager_factory(bot.url, group_interval="1s")
            start = datetime.now(UTC).replace(microsecond=0).isoformat()
            labels = ("host=k-ai-01", "gpu=3", "severity=critical", f"team={quoted(HOSTILE)}")
            fire(am, start, *labels)
            await eventually(lambda: len(handler.received()) == 1, timeout=15)
            fire(am, start, *labels, end=datetime.now(UTC).isoformat())
            await eventually(lambda: len(handler.received()) == 2, timeout=15)

    firing_mail, resolved_mail = (received.mail for received in handler.received())
    assert all(received.tls for received in handler.received())
    assert firing_mail["Subject"] == "[FIRING] GPUXidError on k-ai-01 GPU 3"
    assert resolved_mail["Subject"].startswith("Re: [RESOLVED] GPUXidError on k-ai-01 GPU 3 after ")
    assert resolved_mail["In-Reply-To"] == firing_mail["Message-ID"]
    assert firing_mail["Message-ID"] in resolved_mail["References"]

    text = firing_mail.get_body(("plain",))
    html = firing_mail.get_body(("html",))
    assert text is not None and html is not None
    text_content, html_content = text.get_content(), html.get_content()
    assert "Xid 79 on GPU 3" in text_content and "Xid 79 on GPU 3" in html_content
    assert HOSTILE in text_content
    assert "<script>" not in html_content
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&lt;b&gt;" in html_content


async def test_pagerduty_down_never_holds_up_the_mails(tmp_path: Path, pki: Pki, alertmanager_factory: Any) -> None:
    journal: list[tuple[str, Any]] = []
    key_file = tmp_path / "pd_routing_key"
    key_file.write_text(ROUTING_KEY)
    pagerduty = FakePagerDuty(journal)
    await pagerduty.start()
    await pagerduty.go_down()  # its port refuses connections
    with smtp_server("starttls", pki.trusted, handler=RecordingHandler(journal=journal)) as (port, handler):
        config = {
            "receivers": [
                email_receiver(port, pki),
                {"type": "pagerduty", "name": "pd", "routing_key_file": str(key_file), "url": pagerduty.url},
            ],
            "routing": {"default": ["pd", "oncall-email"]},
            "outbox": FAST_OUTBOX,
        }
        async with running_bot(tmp_path, config) as bot:
            am = alertmanager_factory(bot.url, group_interval="1s")
            start = datetime.now(UTC).replace(microsecond=0).isoformat()
            for gpu in ("0", "1", "2"):
                fire(am, start, "host=k-ai-01", f"gpu={gpu}", "severity=critical")
            await eventually(lambda: len(handler.received()) == 3, timeout=15)
            # The three mails went out while every PagerDuty attempt was refused.
            await eventually(
                lambda: bot.metric("gpu_alert_bot_deliveries_total", {"receiver": "pd", "result": "retry"})
            )
            assert [source for source, _ in journal] == ["email"] * 3

            await pagerduty.come_back()
            await eventually(lambda: len(pagerduty.accepted("trigger")) == 3, timeout=15)
        await pagerduty.stop()

    assert [source for source, _ in journal] == ["email"] * 3 + ["pagerduty"] * 3
    subjects = sorted(str(received.mail["Subject"]) for received in handler.received())
    assert subjects == [f"[FIRING] GPUXidError on k-ai-01 GPU {gpu}" for gpu in ("0", "1", "2")]

"""`Sink.preview` is what `deliver` sends: each built-in sink's preview against what its real (or loopback fake)
server received, and the preview-only construction (`build_previews`) against the live sink's preview."""

from __future__ import annotations

import io
import json
from pathlib import Path

from bot.config import ConsoleReceiver, PagerDutyReceiver, SlackReceiver
from bot.metrics import Metrics
from bot.sinks import build_previews
from bot.sinks.console import ConsoleSink
from bot.sinks.email import EmailSink
from bot.sinks.pagerduty import PagerDutySink
from bot.sinks.slack import SlackSink
from bot.store import Store
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.messages import delivery_of, sample_message
from tests.support.store import sqlite_store
from tests.test_email import receiver as email_receiver
from tests.test_email import smtp_server

ROUTING_KEY = "0123456789abcdef0123456789abcdef"


async def test_console_preview_is_the_line_it_prints() -> None:
    out = io.StringIO()
    sink = ConsoleSink("console", out)
    delivery = delivery_of(sample_message(), "console")
    await sink.deliver(delivery)
    assert sink.preview(delivery) == {"line": json.loads(out.getvalue())}
    assert build_previews([ConsoleReceiver(type="console", name="console")])["console"].preview(delivery) == {
        "line": json.loads(out.getvalue())
    }


async def test_pagerduty_preview_is_the_event_it_posts_with_the_key_masked(tmp_path: Path, store: Store) -> None:
    (tmp_path / "routing_key").write_text(ROUTING_KEY + "\n")
    delivery = delivery_of(sample_message(), "pd")
    async with FakePagerDuty() as fake:
        config = PagerDutyReceiver.model_validate(
            {"type": "pagerduty", "name": "pd", "routing_key_file": str(tmp_path / "routing_key"), "url": fake.url}
        )
        sink = PagerDutySink(config, store)
        try:
            await sink.deliver(delivery)
            preview = sink.preview(delivery)
        finally:
            await sink.close()
        [posted] = fake.accepted()
    assert preview["url"] == fake.url
    assert preview["event"] == {**posted, "routing_key": f"<routing key from {tmp_path / 'routing_key'}>"}
    assert ROUTING_KEY not in json.dumps(preview)
    assert build_previews([config])["pd"].preview(delivery) == preview


async def test_email_preview_is_the_mail_it_sends(tmp_path: Path) -> None:
    delivery = delivery_of(sample_message(), "mail")
    async with sqlite_store(tmp_path) as store:
        with smtp_server("plain") as (port, handler):
            config = email_receiver(port, security="none", allow_plaintext=True)
            sink = EmailSink(config, store)
            await sink.deliver(delivery)
            preview = sink.preview(delivery)
    [received] = handler.mails
    headers = preview["email"]["headers"]
    assert headers == {name: str(received.mail[name]).strip() for name in headers}
    assert headers["Subject"] == "[FIRING] GPUXidError on k-ai-01 GPU 3"
    text, html = (part.get_content() for part in received.mail.iter_parts())
    assert preview["email"]["text"].splitlines() == text.splitlines()  # the wire has CRLF line ends
    assert preview["email"]["html"].splitlines() == html.splitlines()
    assert build_previews([config])["mail"].preview(delivery) == preview


async def test_slack_preview_is_the_first_post_of_an_alert(tmp_path: Path, slack: FakeSlack) -> None:
    (tmp_path / "slack_token").write_text(DEFAULT_TOKEN + "\n")
    config = SlackReceiver.model_validate(
        {
            "type": "slack",
            "name": "slack",
            "channel": "#gpu-alerts",
            "token_file": "slack_token",
            "api_url": slack.api_url,
        },
        context={"base_dir": tmp_path},
    )
    delivery = delivery_of(sample_message(), "slack")
    async with sqlite_store(tmp_path) as store:
        sink = SlackSink(config, store, Metrics())
        try:
            await sink.deliver(delivery)
            preview = sink.preview(delivery)
        finally:
            await sink.close()
    [posted] = slack.top_level()
    assert preview["channel"] == "#gpu-alerts"
    assert (posted.text, posted.attachments) == (preview["payload"]["text"], preview["payload"]["attachments"])
    assert build_previews([config])["slack"].preview(delivery) == preview

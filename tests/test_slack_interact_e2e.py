"""Slack commands and buttons end to end: signed requests into the running bot, silences in a real Alertmanager
(Debian's 0.25), messages in the Slack fake, acknowledgements in the PagerDuty fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.alertmanager import AlertmanagerClient, SilenceMatcher
from bot.interact.silences import SilenceWatcher
from bot.models import AlertState, short_id
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.clock import FakeClock
from tests.support.payloads import gpu_alerts, webhook
from tests.support.processes import free_port
from tests.support.slack_requests import (
    STRANGER,
    click_payload,
    interactive_config,
    post_click,
    post_command,
)
from tests.support.store import ingest_and_dedup, query, sqlite_store

pytestmark = pytest.mark.realstack


@pytest.fixture
async def pagerduty() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty() as fake:
        yield fake


def fire(am: Any, host: str = "k-ai-01") -> None:
    start = datetime.now(UTC).replace(microsecond=0).isoformat()
    am.amtool("alert", "add", "GPUXidError", f"host={host}", "gpu=3", "severity=critical", f"--start={start}")


async def posted_alert(bot: RunningBot, slack: FakeSlack) -> tuple[AlertState, SlackMessage]:
    [root] = await eventually(slack.top_level, timeout=20)
    [alert] = await eventually(lambda: bot.runtime.store.list_alerts("firing"))
    return alert, root


def active_silences(am: Any) -> str:
    return str(am.amtool("silence", "query").stdout)


async def muted_by(am: Any, silence_id: str) -> bool:
    client = AlertmanagerClient([am.url])
    try:
        alerts = await client.alerts(["alertname=GPUXidError"])
    finally:
        await client.close()
    return any(a.status.state == "suppressed" and silence_id in a.status.silenced_by for a in alerts)


async def test_silence_and_unsilence_from_the_slash_command(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any
) -> None:
    port = free_port()
    am = alertmanager_factory(f"http://127.0.0.1:{port}", group_interval="1s")
    async with running_bot(tmp_path, interactive_config(tmp_path, slack, [am.url]), port=port) as bot:
        fire(am)
        alert, root = await posted_alert(bot, slack)
        sid = short_id(alert.key)
        answer = await post_command(bot.url, f"silence {sid} 1h disk swap <!channel> ticket=OPS-1")
        assert answer.startswith(f"Silenced `{sid}` for 1 h")
        silence_id = answer.rsplit("`", 2)[-2]
        assert silence_id in active_silences(am)
        assert await eventually(lambda: muted_by(am, silence_id), timeout=15)
        client = AlertmanagerClient([am.url])
        silence = await client.silence(silence_id)
        await client.close()
        assert silence.created_by == "alice"
        link = f"https://slack.com/archives/{root.channel}/p{root.ts.replace('.', '')}"
        assert silence.comment == f"disk swap <!channel> ticket=OPS-1 (alert {sid} {link}, by alice via gpu-alert-bot)"
        assert [(m.name, m.value) for m in silence.matchers] == [
            ("alertname", "GPUXidError"),
            ("host", "k-ai-01"),
            ("gpu", "3"),
        ]
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and stored.silence_id == silence_id and stored.silenced_by == "alice"
        # The message says so in place, with an Unsilence button, and the thread tells who did it.
        await eventually(lambda: "silenced by *alice*" in root.rendered_text(), timeout=10)
        [note] = await eventually(lambda: slack.replies(root))
        assert "&lt;!channel&gt;" in note.rendered_text() and "<!channel>" not in note.rendered_text()

        answer = await post_command(bot.url, f"unsilence {silence_id}")
        assert answer == f"Expired silence `{silence_id}`."
        assert silence_id not in active_silences(am)
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and stored.silence_id is None
        entries = await bot.runtime.store.audit_log(datetime(2026, 1, 1, tzinfo=UTC))
        assert [(e.action, e.outcome) for e in entries] == [("silence", "done"), ("unsilence", "done")]


async def test_after_unsilence_a_silence_made_by_someone_else_that_still_mutes_the_alert_is_shown(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any
) -> None:
    port = free_port()
    am = alertmanager_factory(f"http://127.0.0.1:{port}", group_interval="1s")
    async with running_bot(tmp_path, interactive_config(tmp_path, slack, [am.url]), port=port) as bot:
        fire(am)
        alert, root = await posted_alert(bot, slack)
        sid = short_id(alert.key)
        own = (await post_command(bot.url, f"silence {sid} 1h")).rsplit("`", 2)[-2]
        # Someone silences the whole host for maintenance, with amtool.
        client = AlertmanagerClient([am.url])
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
        host = await client.create_silence(
            [SilenceMatcher(name="host", value="k-ai-01")],
            starts_at=datetime.now(UTC),
            ends_at=until,
            created_by="bob",
            comment="maintenance",
        )
        await client.close()
        assert await eventually(lambda: muted_by(am, host), timeout=15)

        await post_click(bot.url, click_payload("unsilence", alert.key, root.ts, response_url=slack.response_url()))
        [reply] = await eventually(lambda: slack.responses, timeout=15)
        shown = f'silence `{host}` (host="k-ai-01", by bob, until {until:%Y-%m-%d %H:%M} UTC)'
        assert reply["text"] == (
            f"Expired silence `{own}`. `{sid}` is still muted by {shown}: `unsilence {host}` expires it."
        )
        assert own not in active_silences(am) and host in active_silences(am)
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and (stored.silence_id, stored.silenced_by) == (host, "bob")
        assert stored.silenced_until == until
        # The message shows the alert muted, by the silence that mutes it.
        await eventually(lambda: "silenced by *bob*" in root.rendered_text(), timeout=10)

        # Its Unsilence button expires no silence the bot did not make for the alert; the command does.
        await post_click(bot.url, click_payload("unsilence", alert.key, root.ts, response_url=slack.response_url()))
        await eventually(lambda: len(slack.responses) == 2, timeout=15)
        expected = f"`{sid}` is muted by {shown}, not made for it: `unsilence {host}` expires it."
        assert slack.responses[1]["text"] == expected
        assert host in active_silences(am)
        assert await post_command(bot.url, f"unsilence {host}") == f"Expired silence `{host}`."
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and stored.silence_id is None
        await eventually(lambda: "silenced by" not in root.rendered_text(), timeout=10)


async def test_the_silence_button_uses_the_second_alertmanager_when_the_first_is_down(
    tmp_path: Path, slack: FakeSlack, alertmanager_factory: Any
) -> None:
    port = free_port()
    am = alertmanager_factory(f"http://127.0.0.1:{port}", group_interval="1s")
    down = f"http://127.0.0.1:{free_port()}"
    async with running_bot(tmp_path, interactive_config(tmp_path, slack, [down, am.url]), port=port) as bot:
        fire(am)
        alert, root = await posted_alert(bot, slack)
        click = click_payload("silence-1h", alert.key, root.ts, response_url=slack.response_url())
        assert await post_click(bot.url, click) == 200
        [reply] = await eventually(lambda: slack.responses, timeout=15)
        assert reply["response_type"] == "ephemeral" and reply["text"].startswith(f"Silenced `{short_id(alert.key)}`")
        silence_id = reply["text"].rsplit("`", 2)[-2]
        assert silence_id in active_silences(am)
        assert await eventually(lambda: muted_by(am, silence_id), timeout=15)


async def test_ack_button_updates_the_message_in_place_and_acknowledges_in_pagerduty(
    tmp_path: Path, slack: FakeSlack, pagerduty: FakePagerDuty
) -> None:
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], pagerduty)
    async with running_bot(tmp_path, config) as bot, aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook(gpu_alerts(1)))
        alert, root = await posted_alert(bot, slack)
        buttons = [e["action_id"] for b in root.all_blocks if b["type"] == "actions" for e in b["elements"]]
        assert buttons[:2] == ["ack", "silence-1h"]

        click = click_payload("ack", alert.key, root.ts, response_url=slack.response_url())
        assert await post_click(bot.url, click) == 200
        [ack] = await eventually(lambda: pagerduty.accepted("acknowledge"), timeout=15)
        assert ack["dedup_key"] == alert.key
        await eventually(lambda: "acknowledged by *alice*" in root.rendered_text(), timeout=10)
        assert [m.ts for m in slack.top_level()] == [root.ts]  # updated in place, no new message
        buttons = [e["action_id"] for b in root.all_blocks if b["type"] == "actions" for e in b["elements"]]
        assert buttons[0] == "unack"
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and stored.acked_by == "alice"

        # A second click changes nothing; a click on a resolved alert says so.
        await post_click(bot.url, click)
        await eventually(lambda: len(slack.responses) == 2)
        assert "already acknowledged" in slack.responses[1]["text"]
        resolved = gpu_alerts(1)
        resolved[0].update(status="resolved", endsAt=datetime.now(UTC).isoformat())
        await http.post(bot.webhook_url, json=webhook(resolved))
        await eventually(lambda: root.colour == "#12B76A", timeout=10)
        await post_click(bot.url, click_payload("unack", alert.key, root.ts, response_url=slack.response_url()))
        await eventually(lambda: len(slack.responses) == 3)
        assert slack.responses[2]["text"] == "This alert is already resolved; nothing was changed."


async def test_an_unauthorised_user_is_refused_and_the_refusal_is_audited(tmp_path: Path, slack: FakeSlack) -> None:
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"])
    async with running_bot(tmp_path, config) as bot, aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook(gpu_alerts(1)))
        alert, root = await posted_alert(bot, slack)
        answer = await post_command(bot.url, f"ack {short_id(alert.key)}", user=STRANGER)
        assert answer == "Sorry, `ack` needs the responder role."
        await post_click(bot.url, click_payload("ack", alert.key, root.ts, STRANGER, slack.response_url()))
        [refusal] = await eventually(lambda: slack.responses)
        assert refusal["text"] == answer
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and stored.acked_by is None
        entries = await bot.runtime.store.audit_log(datetime(2026, 1, 1, tzinfo=UTC))
        assert [(e.actor, e.action, e.outcome) for e in entries] == [("slack:U0STRANGER mallory", "ack", "refused")] * 2


async def test_the_periodic_check_tells_when_a_silence_was_removed_in_alertmanager(
    tmp_path: Path, alertmanager_factory: Any
) -> None:
    am = alertmanager_factory("http://127.0.0.1:9")
    client = AlertmanagerClient([am.url])
    clock = FakeClock()
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        kept, removed = await store.list_alerts()
        for alert in (kept, removed):
            silence_id = await client.create_silence(
                [SilenceMatcher(name="gpu", value=alert.labels["gpu"])],
                starts_at=datetime.now(UTC),
                ends_at=datetime.now(UTC) + timedelta(hours=1),
                created_by="alice",
                comment="test",
            )
            await store.set_silence(alert.key, silence_id, "alice", datetime.now(UTC) + timedelta(hours=1), "silenced")
        gone = (await store.get_alert(removed.key)).silence_id  # type: ignore[union-attr]
        assert gone is not None
        await client.expire_silence(gone)  # someone else, with amtool or the UI
        watcher = SilenceWatcher(store, client, clock, interval=60)
        watcher.start()
        await eventually(lambda: clock.sleeping == 1)
        await clock.advance(60)
        await eventually(lambda: _unsilenced(store, removed.key))
        await watcher.stop()
        assert [a.key for a in await store.silenced_alerts()] == [kept.key]
        [(note,)] = query(store, "SELECT text FROM event_notes ORDER BY event_id DESC LIMIT 1")
        assert note == f"silence {gone} of {short_id(removed.key)} was expired early in Alertmanager"
    await client.close()


async def _unsilenced(store: Any, key: str) -> bool:
    alert = await store.get_alert(key)
    return alert is not None and alert.silence_id is None

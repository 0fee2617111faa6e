"""Notes about an alert and its short id: stored, routed like any event, told in the alert's own conversation."""

from __future__ import annotations

import io
import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.config import PagerDutyReceiver
from bot.message import Message
from bot.models import SHORT_ID_ALPHABET, SHORT_ID_LENGTH, Delivery, EventKind, short_id
from bot.render.email import render_email, thread_message_id
from bot.render.pagerduty import pagerduty_event
from bot.sinks.console import ConsoleSink
from bot.storage.interface import UnknownAlert
from tests.fakes.slack import FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.store import Opener, ingest_and_dedup, message, query, route_event, sqlite_store
from tests.test_slack_e2e import bot_config

KEY = "ea7d2357f640d0c0@2026-11-29T13:31:59+00:00"


def note(text: str = "silenced for 1 h by alice", note_id: int = 7) -> Message:
    return message(KEY, "note").model_copy(update={"note": text, "note_id": note_id})


def test_short_id_is_stable_short_and_easy_to_type() -> None:
    assert short_id(KEY) == short_id(KEY)
    assert short_id(KEY) != short_id(KEY.replace("13:31:59", "13:32:00"))
    assert len(short_id(KEY)) == SHORT_ID_LENGTH
    assert not set(short_id(KEY)) & set("0o1li")


@given(st.text(max_size=300))
def test_every_key_gets_a_short_id_of_typable_characters(key: str) -> None:
    made = short_id(key)
    assert len(made) == SHORT_ID_LENGTH and set(made) <= set(SHORT_ID_ALPHABET)


async def test_an_alert_is_found_by_its_short_id_however_it_is_typed(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(3)))
        [first, *_] = await store.list_alerts()
        found = await store.alert_by_short_id(f"  {short_id(first.key).upper()} ")
        assert found is not None and found.key == first.key
        assert await store.alert_by_short_id("zzzzzzz") is None


async def test_alerts_stored_before_short_ids_existed_get_one_on_open(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        with closing(sqlite3.connect(store.path)) as conn, conn:
            conn.execute("DELETE FROM alert_short_ids")
        [alert, _] = await store.list_alerts()
        assert await store.alert_by_short_id(short_id(alert.key)) is None
    async with sqlite_store(tmp_path) as store:
        found = await store.alert_by_short_id(short_id(alert.key))
        assert found is not None and found.key == alert.key


async def test_a_note_is_an_event_of_the_alert_carrying_its_text(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        [firing] = await store.claim_events(10, 60)
        await route_event(store, firing.id, None, [])
        event_id = await store.add_note(firing.alert.key, "acknowledged by <!channel> alice")
        [noted] = await store.claim_events(10, 60)
        assert (noted.id, noted.kind, noted.note) == (event_id, EventKind.NOTE, "acknowledged by <!channel> alice")
        assert [e.kind for e in await store.alert_events(firing.alert.key)] == [EventKind.FIRING, EventKind.NOTE]
        with pytest.raises(UnknownAlert):
            await store.add_note("nope@2026-11-29T13:31:59+00:00", "x")


async def test_pruning_an_alert_removes_its_notes_and_short_id(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook([am_alert(status="resolved", host="k-ai-01", gpu="0")]))
        [alert] = await store.list_alerts()
        await store.add_note(alert.key, "done")
        while events := await store.claim_events(10, 60):  # the note waits behind the resolve
            await route_event(store, events[0].id, None, [])
        await store.prune(datetime.now(UTC) + timedelta(days=1))
        assert query(store, "SELECT COUNT(*) FROM event_notes") == [(0,)]
        assert query(store, "SELECT COUNT(*) FROM alert_short_ids") == [(0,)]


async def test_console_prints_the_note_and_every_line_the_short_id() -> None:
    stream = io.StringIO()
    sink = ConsoleSink("console", stream)
    delivery = Delivery(
        id=1, event_id=7, alert_key=KEY, receiver="console", message=note(), attempts=0, created_at=note().starts_at
    )
    await sink.deliver(delivery)
    line = json.loads(stream.getvalue())
    assert (line["event"], line["note"], line["id"]) == ("note", "silenced for 1 h by alice", short_id(KEY))


def test_pagerduty_sends_nothing_for_a_note(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("R0UTINGKEY0000000000000000000000\n")
    config = PagerDutyReceiver.model_validate(
        {"type": "pagerduty", "name": "pd", "routing_key_file": "key"}, context={"base_dir": tmp_path}
    )
    assert pagerduty_event(note(), config, "R0UTINGKEY0000000000000000000000") is None


def test_a_note_is_an_email_reply_in_the_alert_thread_with_an_id_of_its_own() -> None:
    first = render_email(note(note_id=7), "example.com")
    second = render_email(note(note_id=8), "example.com")
    assert first.in_reply_to == thread_message_id(KEY, "example.com")
    assert first.subject.startswith("Re: [NOTE]")
    assert first.message_id != second.message_id
    assert "silenced for 1 h by alice" in first.text and short_id(KEY) in first.text


async def test_a_note_reaches_the_console_and_the_slack_thread_of_its_alert(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        config = bot_config(tmp_path, slack)
        config["receivers"].append({"type": "console", "name": "console"})
        config["routing"] = {"default": ["slack", "console"]}
        async with running_bot(tmp_path, config) as bot:
            async with aiohttp.ClientSession() as http:
                await http.post(bot.webhook_url, json=webhook(gpu_alerts(1)))
            [root] = await eventually(slack.top_level)
            [alert] = await bot.runtime.store.list_alerts()
            assert f"id `{short_id(alert.key)}`" in root.rendered_text()
            await bot.runtime.store.add_note(alert.key, "silenced by <!channel>")
            bot.runtime.notify_worker()
            [reply] = await eventually(lambda: slack.replies(root))
            assert "silenced by &lt;!channel&gt;" in reply.rendered_text()
            await eventually(lambda: any(e["event"] == "note" for e in bot.console_events()))
            assert [e["id"] for e in bot.console_events()] == [short_id(alert.key)] * 2


def test_acknowledged_again_after_an_unack_is_a_new_mail() -> None:
    first = message(KEY, "ack").model_copy(update={"acked_by": "alice", "acked_at": datetime(2026, 11, 30, tzinfo=UTC)})
    again = first.model_copy(update={"acked_at": datetime(2026, 11, 30, 1, tzinfo=UTC)})
    assert render_email(first, "example.com").message_id != render_email(again, "example.com").message_id

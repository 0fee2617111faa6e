"""An incident in Slack: one card updated in place, a compact thread (a line per host, the list of alerts as one
attached file, one recovery line), exactly once across restarts; driven by incident deliveries as the pipeline
writes them, on the Slack fake (real slack_sdk client, Block Kit limits enforced) and a real SQLite store."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.config import SlackReceiver
from bot.deadman import ALERTNAME
from bot.metrics import Metrics
from bot.models import short_id
from bot.render.slack import Controls
from bot.render.slack.incident import INCIDENT_ACTION
from bot.sinks.base import DeliveryResult
from bot.sinks.slack import SlackRendering
from bot.sinks.slack.state import SinkState
from bot.store.sqlite import SqliteStore
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.clock import FakeClock, running
from tests.support.fleet_incidents import fleet_view, host_name, incident_delivery
from tests.support.slack_receiver import slack_receiver
from tests.test_slack_sink import SinkFactory, alert, delivery, fake, make_sink

__all__ = ["fake", "make_sink"]  # the sink fixtures, used by name (`store` is conftest.py's)

_HOST = re.compile(r"`(k-ai-\d{3})`")


def the_card(slack: FakeSlack) -> SlackMessage:
    [card] = [m for m in slack.top_level() if "GPUTempCritical on" in m.text]
    return card


def host_lines(slack: FakeSlack, card: SlackMessage) -> list[str]:
    return [line for reply in slack.replies(card) for line in reply.rendered_text().splitlines() if _HOST.search(line)]


def attached_text(slack: FakeSlack, card: SlackMessage) -> str:
    [listed] = [f for f in slack.files_in_thread(card) if f["name"].endswith(".txt")]
    data = slack.uploads[listed["id"]].data
    assert data is not None and listed["mimetype"] == "text/plain"
    return data.decode()


async def test_a_storms_thread_has_one_line_per_host_and_every_alert_id_in_the_attached_list(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """1,200 GPUs on 150 hosts: the card, 3 replies of host lines, the list; then the analysed version updates
    the card in place. At most 6 posts."""
    sink = make_sink()
    view = fleet_view()
    assert await sink.deliver(incident_delivery(view)) == DeliveryResult.ok()
    assert await sink.deliver(incident_delivery(fleet_view(version=2, analysed=True))) == DeliveryResult.ok()

    card = the_card(fake)
    assert len(fake.top_level()) == 1
    lines = host_lines(fake, card)
    hosts = [_HOST.search(line).group(1) for line in lines]  # type: ignore[union-attr]
    assert hosts == [host_name(n) for n in range(150)]  # one line per host, worst first
    assert "`k-ai-107` · GPUs 0-7 · 93-95 °C · ids `" in lines[107]
    assert len([r for r in fake.replies(card) if not r.files]) == 3
    listed = attached_text(fake, card)
    assert all(a.short_id in listed for a in view.alerts)
    assert len(listed.splitlines()) == 1 + 1 + 1 + 1200  # title, blank, header, one line per alert
    posts = fake.calls_of("chat.postMessage")
    assert len(posts) <= 6 and all(call.ok for call in posts)
    assert len(fake.calls_of("files.completeUploadExternal")) == 1  # no heat map without pictures
    text = card.rendered_text()
    assert "150 of 1,000 hosts, 1,200 of 8,000 GPUs" in text and "93 to 95 °C" in text
    assert 'row="C"' in text and "inlet temperature rose 9 °C on 147 of 150 affected hosts" in text
    assert "Likely cause: Facility cooling" in text and "First action:* Call the facility" in text
    assert "InletTemperatureHigh on 147 hosts" in text
    # The id a person passes to `report`, where they read it.
    assert "Incident `inc1` · `gpu-alert-bot report inc1`" in text


async def test_at_slacks_pace_1200_alerts_are_all_in_slack_after_5_turns(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """At 1 post/s in the channel (fake time): the card at once, then 3 replies of host lines, one a second, and
    the list's share at once after them (its own method's pace); every alert's id is on its host's line, and all
    are in the list 3 s after the card."""
    async with running(FakeClock(datetime.now(UTC))) as clock:
        sink = make_sink(clock=clock, messages_per_second=1)
        started = clock.monotonic()
        assert await sink.deliver(incident_delivery(fleet_view())) == DeliveryResult.ok()
        took = clock.monotonic() - started
    assert took == pytest.approx(3.0)
    card = the_card(fake)
    ids = " ".join(host_lines(fake, card))
    assert all(f"`{a.short_id}`" in ids for a in fleet_view().alerts)


async def test_a_version_of_1200_alerts_costs_a_few_store_writes_not_one_per_alert(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker per SQLite store: the sink remembers what it wrote. The first version writes each alert's record
    once, in one transaction; a later one reads nothing and writes only what it changed."""
    calls: list[tuple[str, int]] = []
    get, put = store.get_sink_state, store.put_sink_states

    async def counted_get(receiver: str, key: str) -> dict[str, Any] | None:
        calls.append(("get", 1))
        return await get(receiver, key)

    async def counted_put(receiver: str, values: dict[str, dict[str, Any]]) -> None:
        calls.append(("put", len(values)))
        await put(receiver, values)

    monkeypatch.setattr(store, "get_sink_state", counted_get)
    monkeypatch.setattr(store, "put_sink_states", counted_put)
    sink = make_sink()
    await sink.deliver(incident_delivery(fleet_view()))
    assert ("put", 1201) in calls  # the alerts' records and the incident's members, together
    assert len(calls) < 1200 + 20  # a read for each alert never seen, a few writes
    calls.clear()
    await sink.deliver(incident_delivery(fleet_view(version=2, analysed=True)))
    assert [kind for kind, _ in calls] == ["put"] and fake.calls_of("chat.update")  # the card edited, saved once


async def test_the_card_is_posted_once_and_edited_in_place_at_a_pace(fake: FakeSlack, make_sink: SinkFactory) -> None:
    """New hosts' lines show at once; an edit of figures alone waits until 5 s after the last edit (the delivery
    is held, and the newest version comes back); the first complete version and the recovery do not wait."""
    async with running(FakeClock(datetime.now(UTC))) as clock:
        sink = make_sink(clock=clock)
        assert await sink.deliver(incident_delivery(fleet_view(hosts=20))) == DeliveryResult.ok()
        card = the_card(fake)
        held = await sink.deliver(incident_delivery(fleet_view(hosts=22, version=2)))
        assert held.held and held.delay is not None and 4 < held.delay <= 5
        assert len(card.versions) == 0 and len(host_lines(fake, card)) == 22
        await clock.advance(5)
        assert await sink.deliver(incident_delivery(fleet_view(hosts=25, version=3))) == DeliveryResult.ok()
        assert len(card.versions) == 1 and "25 of 1,000 hosts" in card.rendered_text()
        analysed = fleet_view(hosts=25, version=4, analysed=True)
        assert await sink.deliver(incident_delivery(analysed)) == DeliveryResult.ok()
        assert len(card.versions) == 2 and "Likely cause" in card.rendered_text()
        updates = len(fake.calls_of("chat.update"))
        # The same version again, and an older one: nothing to send.
        await clock.advance(5)
        assert await sink.deliver(incident_delivery(analysed)) == DeliveryResult.ok()
        assert await sink.deliver(incident_delivery(fleet_view(hosts=22, version=2))) == DeliveryResult.ok()
    assert len(fake.calls_of("chat.update")) == updates
    assert len(fake.top_level()) == 1
    assert [_HOST.search(line).group(1) for line in host_lines(fake, card)] == [  # type: ignore[union-attr]
        host_name(n) for n in range(25)
    ]
    assert len(fake.calls_of("chat.postMessage")) == 2  # the card, one reply of host lines (edited as hosts join)


async def test_a_host_line_naming_a_new_alert_shows_at_once_while_figures_alone_wait(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """Another alertname joins on a host already listed (a cooling cascade): its line names it at once, so the
    alert is findable; a line whose value alone changed waits for the pace of edits."""
    async with running(FakeClock(datetime.now(UTC))) as clock:
        sink = make_sink(clock=clock)
        first = fleet_view(hosts=20)
        assert await sink.deliver(incident_delivery(first)) == DeliveryResult.ok()
        card = the_card(fake)
        names = ["GPUMemoryTempHigh", "GPUTempCritical"]
        joined = first.model_copy(
            update={
                "version": 2,
                "alertnames": names,
                "hosts": [first.hosts[0].model_copy(update={"alertnames": names}), *first.hosts[1:]],
            }
        )
        assert await sink.deliver(incident_delivery(joined)) == DeliveryResult.ok()
        assert "GPUMemoryTempHigh, GPUTempCritical" in host_lines(fake, card)[0]
        hotter = joined.model_copy(
            update={"version": 3, "hosts": [joined.hosts[0].model_copy(update={"value_max": 99.0}), *joined.hosts[1:]]}
        )
        assert (await sink.deliver(incident_delivery(hotter))).held
        assert "99" not in host_lines(fake, card)[0]


async def test_a_restart_during_the_cards_post_is_still_one_card(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))  # the channel's ID is known from here on
    fake.lose_answer("chat.postMessage")
    first = await sink.deliver(incident_delivery(fleet_view(hosts=60)))
    assert first.retry  # Slack posted the card; the bot cannot know
    await sink.close()
    restarted = make_sink()  # a new process on the same store
    fake.lose_answer("chat.postMessage")  # and a reply of host lines loses its answer too
    assert (await restarted.deliver(incident_delivery(fleet_view(hosts=60)))).retry
    assert await restarted.deliver(incident_delivery(fleet_view(hosts=60, version=2))) == DeliveryResult.ok()
    card = the_card(fake)
    assert len([m for m in fake.top_level() if "GPUTempCritical on" in m.text]) == 1
    assert len(host_lines(fake, card)) == 60  # each host once
    assert len(fake.files_in_thread(card)) == 1
    assert fake.calls_of("conversations.history") and fake.calls_of("conversations.replies")


async def test_the_recovery_is_one_thread_line(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(incident_delivery(fleet_view(hosts=30, analysed=True)))
    resolved = fleet_view(hosts=30, version=2, analysed=True, resolved=True)
    assert await sink.deliver(incident_delivery(resolved)) == DeliveryResult.ok()
    assert await sink.deliver(incident_delivery(resolved)) == DeliveryResult.ok()  # delivered again: told once
    card = the_card(fake)
    assert card.text.startswith("✅ Recovered: GPUTempCritical on 30 hosts")
    recovery = [r for r in fake.replies(card) if "Recovered:" in r.rendered_text()]
    assert len(recovery) == 1
    assert "all resolved at 2026-12-02 14:20:00 UTC, after 18 min; peak 97 °C" in recovery[0].rendered_text()
    assert all("✅" in line and "all resolved" in line for line in host_lines(fake, card))


async def test_fleet_action_buttons_carry_the_incident_and_the_action(fake: FakeSlack, make_sink: SinkFactory) -> None:
    controls = Controls(interactive=True, executable=frozenset({"lower-power-limit", "reset-gpu"}))
    sink = make_sink(controls=controls)
    view = fleet_view(hosts=10, analysed=True)
    view = view.model_copy(update={"cause": view.cause.model_copy(update={"actions": ["lower-power-limit", "drain"]})})  # type: ignore[union-attr]
    assert await sink.deliver(incident_delivery(view)) == DeliveryResult.ok()
    buttons = [e for b in the_card(fake).all_blocks if b["type"] == "actions" for e in b["elements"]]
    [button] = buttons  # "drain" has no executor here: no button a click could only refuse
    assert button["action_id"] == INCIDENT_ACTION
    assert json.loads(button["value"]) == {"incident": "inc1", "action": "lower-power-limit"}
    assert "80 GPUs" in button["text"]["text"] and "approved" in button["confirm"]["text"]["text"]


async def test_an_ack_or_a_note_about_an_alert_of_the_incident_is_a_line_in_its_thread(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    sink = make_sink()
    view = fleet_view(hosts=5)
    await sink.deliver(incident_delivery(view))
    member = view.alerts[3]
    acked = alert(1, "ack", alert_key=member.alert_key, acked_by="alice", title="GPUTempCritical on k-ai-000 GPU 3")
    assert await sink.deliver(delivery(acked)) == DeliveryResult.ok()
    note = alert(1, "note", alert_key=member.alert_key, note="silenced by bob for 2 h", note_id=7)
    assert await sink.deliver(delivery(note)) == DeliveryResult.ok()
    assert await sink.deliver(delivery(alert(1, "repeat", alert_key=member.alert_key))) == DeliveryResult.ok()
    assert await sink.deliver(delivery(alert(1, "resolved", alert_key=member.alert_key))) == DeliveryResult.ok()
    card = the_card(fake)
    assert len(fake.top_level()) == 1  # the incident tells its alerts' repeats and resolves
    [told] = [r for r in fake.replies(card) if "acknowledged by" in r.rendered_text()]
    assert f"(id {short_id(member.alert_key)})" in told.rendered_text() and "alice" in told.rendered_text()
    [silenced] = [r for r in fake.replies(card) if "silenced by bob" in r.rendered_text()]
    assert f"(id {short_id(member.alert_key)})" in silenced.rendered_text()
    # `/gpu silence` links a silence to the alert's message: for an alert of an incident, the card.
    record = await store.get_sink_state("slack", f"alert:{member.alert_key}")
    assert record is not None and (record["channel"], record["ts"]) == (card.channel, card.ts)


async def test_a_fleet_runs_notes_and_approval_find_the_cards_thread(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    """A fleet action's run is about the incident (alert key `incident:<id>`): its notes are lines of the card's
    thread, and its approval message (bot/interact/approval.py) finds that thread in the same record."""
    sink = make_sink()
    await sink.deliver(incident_delivery(fleet_view(hosts=4)))
    card = the_card(fake)
    said = alert(1, "note", alert_key="incident:inc1", title="GPUTempCritical on 4 hosts", note="approved by bob")
    assert await sink.deliver(delivery(said)) == DeliveryResult.ok()
    [told] = [r for r in fake.replies(card) if "approved by bob" in r.rendered_text()]
    assert "(id " not in told.rendered_text()
    record = await SinkState(store, "slack").record("incident:inc1")
    assert record is not None and (record.channel, record.thread_ts) == (card.channel, card.ts)


async def test_an_alert_of_an_incident_firing_again_once_it_is_over_is_shown_anew(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    sink = make_sink()
    await sink.deliver(incident_delivery(fleet_view(hosts=2)))
    key = fleet_view(hosts=2).alerts[0].alert_key
    await sink.deliver(delivery(alert(1, "refiring", alert_key=key)))  # still open: its line tells it
    assert len(fake.top_level()) == 1
    await sink.deliver(incident_delivery(fleet_view(hosts=2, version=2, resolved=True)))
    assert await sink.deliver(delivery(alert(1, "refiring", alert_key=key))) == DeliveryResult.ok()
    assert len(fake.top_level()) == 2
    # A record from the version that listed alerts in storms reads as an alert told as a line.
    await store.put_sink_states("slack", {f"alert:{alert(2).alert_key}": {"mode": "storm", "storm": "1", "seq": 4}})
    assert await sink.deliver(delivery(alert(2, "resolved"))) == DeliveryResult.ok()
    assert await sink.deliver(delivery(alert(2, "refiring"))) == DeliveryResult.ok()
    assert len(fake.top_level()) == 3


def test_explain_previews_the_card(tmp_path: Path, fake: FakeSlack) -> None:
    receiver = SlackReceiver.model_validate(slack_receiver(tmp_path, fake), context={"base_dir": tmp_path})
    preview = SlackRendering(receiver).preview(incident_delivery(fleet_view(hosts=3)))
    assert preview["channel"] == "#gpu-alerts" and "GPUTempCritical on 3 hosts" in preview["payload"]["text"]


async def test_the_bots_own_alerts_keep_their_own_message_during_an_incident(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """Which alerts form an incident is the pipeline's choice (the bot's own never do); the sink shows an alert
    delivered on its own as its own message, whatever incident is open in the channel."""
    sink = make_sink()
    await sink.deliver(incident_delivery(fleet_view(hosts=40)))
    watchdog = alert(901, alertname=ALERTNAME, title=ALERTNAME, host="", gpu="", labels={"alertname": ALERTNAME})
    assert await sink.deliver(delivery(watchdog)) == DeliveryResult.ok()
    assert [m.text.count(ALERTNAME) > 0 for m in fake.top_level()] == [False, True]
    assert not any(ALERTNAME in r.rendered_text() for r in fake.replies(the_card(fake)))


async def test_a_file_slack_refuses_leaves_the_card_and_lines_in_place(fake: FakeSlack, make_sink: SinkFactory) -> None:
    metrics = Metrics()
    sink = make_sink(metrics)
    fake.fail_next("files.completeUploadExternal", error="not_in_channel")
    assert await sink.deliver(incident_delivery(fleet_view(hosts=12))) == DeliveryResult.ok()
    assert len(host_lines(fake, the_card(fake))) == 12 and fake.files_in_thread(the_card(fake)) == []

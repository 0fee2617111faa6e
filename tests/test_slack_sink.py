"""The Slack sink against the fake Slack Web API, on a real SQLite store: conversation, errors, exactly once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.slack_response import SlackResponse

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import SlackReceiver
from bot.message import Fact, Link, Message
from bot.metrics import Metrics
from bot.models import Delivery
from bot.render.slack import Controls
from bot.sinks.base import DeliveryResult
from bot.sinks.slack import SlackRateLimits, SlackSink
from bot.sinks.slack.channel import _api_failure
from bot.sinks.slack.pacing import retry_after
from bot.store.sqlite import SqliteStore
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.bot import eventually
from tests.support.clock import FakeClock, running
from tests.support.messages import delivery_of
from tests.support.slack_receiver import slack_receiver
from tests.test_secret_files import rotate

STARTED = datetime(2026, 11, 29, 13, 30, tzinfo=UTC)
_ids = itertools.count(1)

SinkFactory = Callable[..., SlackSink]


def alert(n: int = 1, event: str = "firing", **changes: Any) -> Message:
    status = "resolved" if event == "resolved" else "firing"
    fields: dict[str, Any] = {
        "alert_key": f"fp{n:04d}@2026-11-29T13:30:00+00:00",
        "fingerprint": f"fp{n:04d}",
        "group_key": "g",
        "event": event,
        "status": status,
        "severity": "critical",
        "title": f"GPUTempHigh on k-ai-{n:02d} GPU {n % 8}",
        "summary": f"GPU {n % 8} at 92 °C",
        "host": f"k-ai-{n:02d}",
        "gpu": str(n % 8),
        "alertname": "GPUTempHigh",
        "starts_at": STARTED,
        "resolved_at": STARTED + timedelta(minutes=12) if status == "resolved" else None,
        "facts": [Fact(label="Host", value=f"k-ai-{n:02d}")],
        "links": [Link(text="Runbook", url="https://wiki.example.com/gpu-temp")],
    }
    fields.update(changes)
    return Message(**fields)


def delivery(message: Message) -> Delivery:
    return delivery_of(message, "slack", next(_ids))


@pytest.fixture
def fake(slack: FakeSlack) -> FakeSlack:
    """The Slack fake of tests/conftest.py, by the name these tests give it."""
    return slack


@pytest.fixture
async def make_sink(tmp_path: Path, fake: FakeSlack, store: SqliteStore) -> AsyncIterator[SinkFactory]:
    sinks: list[SlackSink] = []

    def make(
        metrics: Metrics | None = None,
        controls: Controls | None = None,
        clock: Clock = SYSTEM_CLOCK,
        limits: SlackRateLimits | None = None,
        **options: Any,
    ) -> SlackSink:
        config = slack_receiver(tmp_path, fake, messages_per_second=50) | options
        receiver = SlackReceiver.model_validate(config, context={"base_dir": tmp_path})
        sink = SlackSink(receiver, store, metrics or Metrics(), limits, controls=controls or Controls(), clock=clock)
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        await sink.close()


async def test_firing_repeat_resolve_is_one_message_updated_in_place(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    assert await sink.deliver(delivery(alert(1))) == DeliveryResult.ok()
    assert await sink.deliver(delivery(alert(1, "repeat", times_seen=3))) == DeliveryResult.ok()
    assert await sink.deliver(delivery(alert(1, "resolved"))) == DeliveryResult.ok()

    [root] = fake.top_level()
    assert root.colour == "#12B76A" and root.text.startswith("✅ Resolved after 12 min")
    assert len(root.versions) == 1 and root.versions[0]["attachments"][0]["color"] == "#D92D20"
    replies = fake.replies(root)
    assert "still firing, seen 3 times" in replies[0].text
    assert "resolved after 12 min" in replies[1].text
    assert root.metadata is not None and root.metadata["event_payload"]["alert_key"] == alert(1).alert_key
    posts_and_updates = ["chat.postMessage"] * 2 + ["chat.update", "chat.postMessage"]
    assert [c.method for c in fake.calls] == ["conversations.list", *posts_and_updates]  # the channel's ID, once


async def test_firing_again_after_a_resolve_reopens_the_same_message(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    await sink.deliver(delivery(alert(1, "resolved")))
    refiring = delivery(alert(1, "refiring", times_seen=3))
    assert await sink.deliver(refiring) == DeliveryResult.ok()
    assert await sink.deliver(refiring) == DeliveryResult.ok()  # a retry tells nobody twice
    [root] = fake.top_level()
    assert root.colour == "#D92D20" and not root.text.startswith("✅")
    await sink.deliver(delivery(alert(1, "resolved", times_seen=4)))
    assert [r.text.split("*")[2].strip() for r in fake.replies(root)] == [
        "resolved after 12 min",
        "firing again after it was resolved",
        "resolved after 12 min",
    ]
    assert root.colour == "#12B76A" and len(fake.top_level()) == 1


async def test_a_related_alert_of_a_resolved_alert_is_posted_top_level(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    await sink.deliver(delivery(alert(1, "resolved")))
    await sink.deliver(delivery(alert(2, related_to=alert(1).alert_key)))
    resolved_root, new = fake.top_level()
    assert "k-ai-02" in new.text and new.colour == "#D92D20" and fake.replies(resolved_root)[-1].text.startswith("✅")


async def test_same_delivery_twice_posts_once(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    message = alert(1)
    await sink.deliver(delivery(message))
    await sink.deliver(delivery(message))
    await sink.deliver(delivery(alert(1, "repeat", times_seen=2)))
    await sink.deliver(delivery(alert(1, "repeat", times_seen=2)))
    assert len(fake.top_level()) == 1 and len(fake.replies(fake.top_level()[0])) == 1


async def test_ack_updates_the_message_and_tells_the_thread(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    await sink.deliver(delivery(alert(1, "ack", acked_by="alice")))
    [root] = fake.top_level()
    assert "acknowledged by *alice*" in root.rendered_text()
    assert "acknowledged by *alice*" in fake.replies(root)[0].text


async def test_related_alert_goes_into_the_earlier_alerts_thread(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1, title="GPUXidError on k-ai-01 GPU 1")))
    related = alert(2, title="GPUTempHigh on k-ai-01 GPU 1", related_to=alert(1).alert_key)
    await sink.deliver(delivery(related))
    await sink.deliver(delivery(alert(2, "resolved", title=related.title, related_to=related.related_to)))

    [root] = fake.top_level()
    [reply] = fake.replies(root)
    assert reply.text.startswith("✅ Resolved after 12 min: GPUTempHigh")  # the reply itself was updated
    assert "related in thread: GPUTempHigh on k-ai-01 GPU 1 (resolved)" in root.rendered_text()
    assert "GPUXidError on k-ai-01 GPU 1" in root.text


async def test_a_related_alert_whose_root_message_is_gone_is_still_delivered(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    fake.fail_next("chat.update", error="message_not_found")
    assert await sink.deliver(delivery(alert(2, related_to=alert(1).alert_key))) == DeliveryResult.ok()
    resolved = alert(2, "resolved", related_to=alert(1).alert_key)
    assert await sink.deliver(delivery(resolved)) == DeliveryResult.ok()
    [reply] = fake.replies(fake.top_level()[0])
    assert reply.text.startswith("✅ Resolved after 12 min")


async def test_a_fractional_retry_after_goes_back_to_the_outbox_with_its_wait(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    fake.fail_next("chat.postMessage", status=429, retry_after=1.5)
    result = await make_sink().deliver(delivery(alert(1)))
    assert (result.retry, result.reason, result.delay) == (True, "ratelimited", 1.5)


async def test_429_is_waited_out_and_delivered_once(fake: FakeSlack, make_sink: SinkFactory) -> None:
    fake.fail_next("chat.postMessage", status=429, retry_after=1)
    assert await make_sink().deliver(delivery(alert(1))) == DeliveryResult.ok()
    assert [c.status for c in fake.calls_of("chat.postMessage")] == [429, 200]
    assert len(fake.top_level()) == 1


async def test_a_long_retry_after_is_handed_to_the_outbox(fake: FakeSlack, make_sink: SinkFactory) -> None:
    fake.fail_next("chat.postMessage", status=429, retry_after=45)
    result = await make_sink().deliver(delivery(alert(1)))
    assert (result.retry, result.reason, result.delay) == (True, "ratelimited", 45.0)
    assert fake.top_level() == []


@pytest.mark.parametrize(
    ("error", "channel"),
    [
        ("channel_not_found", "#nowhere"),
        ("not_in_channel", None),
        ("is_archived", None),
        ("invalid_auth", None),
        ("token_revoked", None),
        ("invalid_blocks", None),
        ("msg_too_long", None),
    ],
)
async def test_permanent_slack_errors_fail_for_good(
    fake: FakeSlack, make_sink: SinkFactory, error: str, channel: str | None
) -> None:
    if channel is None:
        fake.fail_next("chat.postMessage", error=error)
    sink = make_sink(channel=channel or "#gpu-alerts")
    result = await sink.deliver(delivery(alert(1)))
    assert (result.delivered, result.retry, result.reason) == (False, False, error)
    assert error in result.detail
    # A later event of the same alert is not lost: it posts the message that could not be posted.
    if channel is None:
        assert await sink.deliver(delivery(alert(1, "resolved"))) == DeliveryResult.ok()
        assert len(fake.top_level()) == 1


async def test_wrong_token_is_invalid_auth(fake: FakeSlack, make_sink: SinkFactory) -> None:
    fake.token = "xoxb-another-token"
    result = await make_sink().deliver(delivery(alert(1)))
    assert (result.retry, result.reason) == (False, "invalid_auth")


async def test_a_rotated_token_file_is_used_from_the_next_call(
    tmp_path: Path, fake: FakeSlack, make_sink: SinkFactory
) -> None:
    sink = make_sink()
    assert await sink.deliver(delivery(alert(1))) == DeliveryResult.ok()
    fake.token = "xoxb-rotated-token"
    rotate(tmp_path / "slack_token", fake.token)
    assert await sink.deliver(delivery(alert(2))) == DeliveryResult.ok()


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ({"status": 503}, "http_503"),
        ({"status": 502, "body": "<html>bad gateway</html>", "content_type": "text/html"}, "http_502"),
        ({"error": "internal_error"}, "internal_error"),
        ({"error": "service_unavailable"}, "service_unavailable"),
        ({"status": 429, "retry_after": 0, "times": 3}, "ratelimited"),
    ],
)
async def test_transient_answers_are_retried_later(
    fake: FakeSlack, make_sink: SinkFactory, script: dict[str, Any], reason: str
) -> None:
    fake.fail_next("chat.postMessage", **script)
    result = await make_sink().deliver(delivery(alert(1)))
    assert (result.delivered, result.retry, result.reason) == (False, True, reason)


async def test_slack_down_is_retried_later_then_posted_once(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await fake.go_down()
    result = await sink.deliver(delivery(alert(1)))
    assert (result.retry, result.reason) == (True, "connection_refused")
    await fake.come_back()
    assert await sink.deliver(delivery(alert(1))) == DeliveryResult.ok()
    assert len(fake.top_level()) == 1


async def test_a_lost_answer_is_found_again_not_posted_twice(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))  # the channel ID is known from here on
    fake.lose_answer("chat.postMessage")
    result = await sink.deliver(delivery(alert(2)))
    assert (result.retry, result.reason) == (True, "connection_lost")
    assert len(fake.top_level()) == 2  # Slack did post it
    # A new process (same store) retries the delivery: it finds the post by its metadata nonce.
    restarted = make_sink()
    assert await restarted.deliver(delivery(alert(2))) == DeliveryResult.ok()
    assert len(fake.top_level()) == 2
    assert fake.calls_of("conversations.history")[0].args["include_all_metadata"] in ("1", "true", True)
    await restarted.deliver(delivery(alert(2, "resolved")))
    assert fake.top_level()[1].colour == "#12B76A"


@pytest.mark.parametrize("event", ["repeat", "resolved", "ack"])
async def test_a_thread_note_whose_answer_was_lost_is_not_posted_twice(
    fake: FakeSlack, make_sink: SinkFactory, event: str
) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    note = delivery(alert(1, event, times_seen=3, acked_by="alice" if event == "ack" else None))
    fake.lose_answer("chat.postMessage")
    assert (await sink.deliver(note)).retry
    assert await make_sink().deliver(note) == DeliveryResult.ok()  # the outbox's retry, after a restart
    [root] = fake.top_level()
    assert len(fake.replies(root)) == 1


async def test_lost_answer_in_a_thread_is_found_again(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    fake.lose_answer("chat.postMessage")
    related = alert(2, related_to=alert(1).alert_key)
    assert (await sink.deliver(delivery(related))).reason == "connection_lost"
    assert await sink.deliver(delivery(related)) == DeliveryResult.ok()
    assert len(fake.replies(fake.top_level()[0])) == 1
    assert fake.calls_of("conversations.replies")


async def test_without_history_access_a_lost_answer_is_posted_again(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    fake.lose_answer("chat.postMessage")
    await sink.deliver(delivery(alert(2)))
    fake.fail_next("conversations.history", error="missing_scope")
    assert await sink.deliver(delivery(alert(2))) == DeliveryResult.ok()
    assert len(fake.top_level()) == 3  # the documented limit: at least once rather than never


async def test_an_update_never_becomes_a_new_message(fake: FakeSlack, make_sink: SinkFactory) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    fake.fail_next("chat.update", error="message_not_found")
    result = await sink.deliver(delivery(alert(1, "resolved")))
    assert (result.retry, result.reason) == (False, "message_not_found")
    assert len(fake.top_level()) == 1


async def test_posts_are_paced_per_channel(fake: FakeSlack, make_sink: SinkFactory) -> None:
    """A token bucket with a burst of one: each post after the first waits 1 / rate for its turn (the pace
    measured against a real clock is in bench/pacing.py)."""
    rate = 10.0
    clock = FakeClock(datetime.now(UTC))
    sink = make_sink(clock=clock, messages_per_second=rate)

    async def deliver_all() -> None:
        for n in range(8):
            assert await sink.deliver(delivery(alert(n))) == DeliveryResult.ok()

    delivering = asyncio.create_task(deliver_all())
    waits: list[float] = []
    while not delivering.done():
        await eventually(lambda: delivering.done() or clock.sleeping)
        if clock.sleeping:
            waits.append(clock.next_wake or 0.0)
            await clock.advance(waits[-1])
    await delivering
    assert waits == [pytest.approx(1 / rate)] * 7
    assert len(fake.post_times()) == 8


async def test_edits_take_turns_of_their_own_not_behind_the_channels_posts(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """Slack limits chat.postMessage per channel and chat.update per method and workspace: at one a second each,
    the edits of two resolves take no turn of the posts (n posts take n - 1 seconds, edits or not)."""
    async with running(FakeClock(datetime.now(UTC))) as clock:
        sink = make_sink(clock=clock, messages_per_second=1)
        for message in (alert(1), alert(2), alert(1, "resolved"), alert(2, "resolved")):
            assert await sink.deliver(delivery(message)) == DeliveryResult.ok()
    posts, edits = (len(fake.calls_of(method)) for method in ("chat.postMessage", "chat.update"))
    assert edits == 2
    assert clock.monotonic() == pytest.approx(posts - 1)


async def test_hostile_label_values_are_escaped_in_slack(fake: FakeSlack, make_sink: SinkFactory) -> None:
    await make_sink().deliver(delivery(alert(1, summary="<!channel> please look", host="<@U0BOSS>")))
    text = fake.top_level()[0].rendered_text()
    assert "<!channel>" not in text and "<@U0BOSS>" not in text and "&lt;!channel&gt;" in text


async def test_the_fake_answers_other_methods_like_slack(fake: FakeSlack) -> None:
    client = AsyncWebClient(token=DEFAULT_TOKEN, base_url=fake.api_url)
    assert (await client.auth_test())["user_id"] == "U0FAKEBOT"
    ephemeral = await client.chat_postEphemeral(channel="#gpu-alerts", user="U0ALICE", text="only you")
    with pytest.raises(SlackApiError) as raised:
        await client.chat_update(channel="C0GPUALERTS", ts=ephemeral["message_ts"], text="edit")
    assert raised.value.response["error"] == "message_not_found"
    with pytest.raises(SlackApiError) as raised:
        await client.chat_postMessage(channel="#gpu-alerts", text="x", blocks=[{"type": "section"}])
    assert raised.value.response["error"] == "invalid_blocks"
    assert fake.messages == []


def test_retry_after_headers_in_slack_sdks_shapes() -> None:
    assert retry_after({"retry-after": ["3"]}) == 3.0
    assert retry_after({"Retry-After": "2"}) == 2.0
    assert retry_after({"Retry-After": []}) is None
    assert retry_after(None) is None


def test_an_error_without_metadata_messages_is_still_classified() -> None:
    answer = {"ok": False, "error": "channel_not_found", "response_metadata": {"messages": None}}
    response = SlackResponse(
        client=None, http_verb="POST", api_url="", req_args={}, data=answer, headers={}, status_code=200
    )
    failure = _api_failure("chat.postMessage", SlackApiError("channel_not_found", response))
    assert (failure.result.retry, failure.result.reason) == (False, "channel_not_found")


@pytest.mark.parametrize("event", ["resolved", "ack"])
async def test_a_resolve_or_ack_delivered_again_adds_one_note(
    fake: FakeSlack, make_sink: SinkFactory, event: str
) -> None:
    sink = make_sink()
    await sink.deliver(delivery(alert(1)))
    again = delivery(alert(1, event, acked_by="alice" if event == "ack" else None))
    assert await sink.deliver(again) == DeliveryResult.ok()
    assert await sink.deliver(again) == DeliveryResult.ok()  # the outbox's at-least-once re-delivery
    [root] = fake.top_level()
    assert len(fake.replies(root)) == 1


async def test_a_cold_start_whose_posts_are_answered_too_late_posts_each_alert_once(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    # Channel by name, nothing posted yet: the ID the lookup needs comes from conversations.list, not from an
    # answer to a post, so even the very first post in doubt is looked for rather than posted again.
    sink = make_sink(timeout=0.3)
    fake.answer_late("chat.postMessage", 1.0)
    for n in (1, 2, 3):
        first = await sink.deliver(delivery(alert(n)))
        assert (first.retry, first.reason) == (True, "timeout")  # Slack posted it; the bot cannot know
        assert await sink.deliver(delivery(alert(n))) == DeliveryResult.ok()  # the outbox's retry
    assert len(fake.top_level()) == 3
    assert len(fake.calls_of("chat.postMessage")) == 3
    assert len(fake.calls_of("conversations.history")) == 3
    [lookup] = fake.calls_of("conversations.list")
    assert lookup.args["types"] == "public_channel,private_channel"


async def test_without_the_channel_list_scope_posting_by_name_still_works(
    fake: FakeSlack, make_sink: SinkFactory, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail_next("conversations.list", error="missing_scope")
    sink = make_sink()
    assert await sink.deliver(delivery(alert(1))) == DeliveryResult.ok()
    assert await sink.deliver(delivery(alert(2))) == DeliveryResult.ok()
    assert len(fake.top_level()) == 2
    assert len(fake.calls_of("conversations.list")) == 1  # asked once per process, not before every post
    assert any("grant channels:read" in r.getMessage() for r in caplog.records)


async def test_a_channel_list_that_fails_for_now_is_retried_before_posting(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    fake.fail_next("conversations.list", status=503)
    sink = make_sink()
    result = await sink.deliver(delivery(alert(1)))
    assert (result.retry, result.reason) == (True, "http_503")
    assert fake.top_level() == []
    assert await sink.deliver(delivery(alert(1))) == DeliveryResult.ok()
    assert [m.channel for m in fake.top_level()] == ["C0GPUALERTS"]


async def test_a_note_is_a_thread_reply_and_refreshes_the_message_and_a_second_ack_is_told(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    sink = make_sink(controls=Controls(interactive=True))
    await sink.deliver(delivery(alert(1)))
    [root] = fake.top_level()
    await sink.deliver(delivery(alert(1, "ack", acked_by="alice")))
    await sink.deliver(delivery(alert(1, "note", note="acknowledgement withdrawn by alice", note_id=5)))
    assert "acknowledged" not in root.rendered_text()
    buttons = [e["action_id"] for b in root.all_blocks if b["type"] == "actions" for e in b["elements"]]
    assert buttons[0] == "ack"
    await sink.deliver(delivery(alert(1, "ack", acked_by="alice")))
    replies = [reply.rendered_text() for reply in fake.replies(root)]
    assert [("acknowledged by" in r, "withdrawn" in r) for r in replies] == [
        (True, False),
        (False, True),
        (True, False),
    ]
    assert [m.ts for m in fake.top_level()] == [root.ts]

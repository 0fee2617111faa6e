"""An alert's picture in its Slack thread: after the message, with Slack's three-step upload, exactly once; an
incident's heat map in its card's thread."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import SlackReceiver
from bot.metrics import Metrics
from bot.render.graph_worker import GraphLimits, GraphRenderer
from bot.sinks.base import DeliveryResult
from bot.sinks.graphs import AlertPictures
from bot.sinks.slack import SlackSink
from bot.store.sqlite import SqliteStore
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack, SlackMessage
from tests.support.clock import FakeClock, running
from tests.support.fleet_incidents import fleet_view, incident_delivery
from tests.support.graphs import stored_alert_delivery
from tests.support.slack_receiver import slack_receiver

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SinkFactory = Callable[..., SlackSink]


@pytest.fixture
def fake(slack: FakeSlack) -> FakeSlack:
    """The Slack fake of tests/conftest.py, by the name these tests give it."""
    return slack


@pytest.fixture
async def make_sink(tmp_path: Path, fake: FakeSlack, store: SqliteStore) -> AsyncIterator[SinkFactory]:
    """A Slack sink with pictures; each call is a new process's sink (its own graph worker) on the same store."""
    sinks: list[SlackSink] = []

    def make(
        metrics: Metrics | None = None, limits: GraphLimits | None = None, clock: Clock = SYSTEM_CLOCK, **options: Any
    ) -> SlackSink:
        config = slack_receiver(tmp_path, fake, messages_per_second=50) | options
        receiver = SlackReceiver.model_validate(config, context={"base_dir": tmp_path})
        metrics = metrics or Metrics()
        renderer = GraphRenderer(metrics, limits or GraphLimits())
        pictures = AlertPictures(store, renderer, receiver.graphs, receiver.graph_theme)
        sink = SlackSink(receiver, store, metrics, clock=clock, pictures=pictures)
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        await sink.close()


def the_message(fake: FakeSlack) -> SlackMessage:
    [message] = fake.top_level()
    return message


def methods(fake: FakeSlack) -> list[str]:
    return [call.method for call in fake.calls if call.method != "conversations.list"]


async def test_one_alert_is_one_message_then_one_image_in_its_thread(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    metrics = Metrics()
    sink = make_sink(metrics)
    delivery = await stored_alert_delivery(store, "slack")
    assert await sink.deliver(delivery) == DeliveryResult.ok()
    message = the_message(fake)
    [image] = fake.files_in_thread(message)
    assert image["mimetype"] == "image/png" and image["name"] == "GPUTempCritical-k-ai-01-gpu3.png"
    assert image["title"] == "GPUTempCritical · k-ai-01 GPU 3"
    upload = fake.uploads[image["id"]]
    assert upload.data is not None and upload.data.startswith(b"\x89PNG") and upload.shares == 1
    assert "fires when > 87 °C" in upload.alt_txt
    # The text first, then the three steps; the share names the channel's ID and the message as the thread.
    assert methods(fake) == [
        "chat.postMessage",
        "files.getUploadURLExternal",
        "upload",
        "files.completeUploadExternal",
    ]
    [complete] = fake.calls_of("files.completeUploadExternal")
    assert (complete.args["channel_id"], complete.args["thread_ts"]) == (message.channel, message.ts)
    assert "Authorization" not in fake.calls_of("upload")[0].headers  # the upload URL is its own authority
    assert metrics.graphs.labels("rendered")._value.get() == 1
    # Delivered again (an HA copy, a retry after a lost answer to the outbox): nothing more in Slack.
    assert await sink.deliver(delivery) == DeliveryResult.ok()
    assert len(fake.messages) == 2 and len(fake.uploads) == 1


async def test_a_restart_during_the_upload_still_shows_one_image(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    delivery = await stored_alert_delivery(store, "slack")
    fake.lose_answer("files.completeUploadExternal")  # Slack shares the file, its answer never arrives
    result = await make_sink().deliver(delivery)
    assert (result.delivered, result.retry) == (False, True)
    assert len(fake.files_in_thread(the_message(fake))) == 1
    # A new process retries the delivery the outbox kept: the message is not posted again, the share in doubt is
    # found in the thread instead of being made twice.
    assert await make_sink().deliver(delivery) == DeliveryResult.ok()
    assert len(fake.top_level()) == 1
    assert len(fake.files_in_thread(the_message(fake))) == 1
    assert len(fake.calls_of("files.completeUploadExternal")) == 1
    assert fake.calls_of("conversations.replies")


async def test_a_restart_between_the_message_and_its_image_posts_the_image_once(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    delivery = await stored_alert_delivery(store, "slack")
    fake.fail_next("upload", status=503)
    result = await make_sink().deliver(delivery)
    assert (result.retry, result.reason) == (True, "upload_http_503")
    assert fake.files_in_thread(the_message(fake)) == []
    assert await make_sink().deliver(delivery) == DeliveryResult.ok()
    assert len(fake.top_level()) == 1
    assert len(fake.files_in_thread(the_message(fake))) == 1
    assert len(fake.calls_of("chat.postMessage")) == 1


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(lambda fake: fake.fail_next("upload", status=404, body="invalid upload URL"), id="invalid-url"),
        pytest.param(lambda fake: setattr(fake, "member_of", set()), id="not_in_channel"),
        pytest.param(
            lambda fake: fake.fail_next("files.getUploadURLExternal", error="missing_scope"), id="no-files-write"
        ),
    ],
)
async def test_an_upload_refused_for_good_leaves_the_message_alone_and_is_counted(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore, failure: Callable[[FakeSlack], None]
) -> None:
    metrics = Metrics()
    failure(fake)
    delivery = await stored_alert_delivery(store, "slack")
    assert await make_sink(metrics).deliver(delivery) == DeliveryResult.ok()
    assert fake.files_in_thread(the_message(fake)) == []
    assert metrics.graphs.labels("upload_failed")._value.get() == 1
    assert await make_sink(metrics).deliver(delivery) == DeliveryResult.ok()  # given up: not tried again
    assert len(fake.calls_of("files.getUploadURLExternal")) <= 1


async def test_an_upload_that_keeps_failing_is_given_up_after_a_few_attempts(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    metrics = Metrics()
    sink = make_sink(metrics)
    delivery = await stored_alert_delivery(store, "slack")
    fake.fail_next("upload", status=500, times=5)
    outcomes = [await sink.deliver(delivery) for _ in range(3)]
    assert [o.retry for o in outcomes] == [True, True, False] and outcomes[-1].delivered
    assert len(fake.top_level()) == 1 and fake.files_in_thread(the_message(fake)) == []
    assert metrics.graphs.labels("upload_failed")._value.get() == 1


async def test_graphs_false_sends_the_text_alone(fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore) -> None:
    delivery = await stored_alert_delivery(store, "slack")
    assert await make_sink(graphs=False).deliver(delivery) == DeliveryResult.ok()
    assert methods(fake) == ["chat.postMessage"]


async def test_a_failed_drawing_sends_the_text_alone_and_is_counted(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    metrics = Metrics()
    delivery = await stored_alert_delivery(store, "slack")
    sink = make_sink(metrics, GraphLimits(memory_mb=1), graph_theme="dark")
    assert await sink.deliver(delivery) == DeliveryResult.ok()
    assert methods(fake) == ["chat.postMessage"]
    assert metrics.graphs.labels("failed")._value.get() == 1


async def test_the_heat_map_comes_with_the_cards_first_complete_version_once(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """Not while the incident's evidence is being gathered; with the first analysed version; not again for the
    same alerts (the list of alerts is its own file)."""
    sink = make_sink()
    assert await sink.deliver(incident_delivery(fleet_view(hosts=40, spread=6.0))) == DeliveryResult.ok()
    [card] = fake.top_level()
    assert [f["name"] for f in fake.files_in_thread(card)] == ["incident-inc1-alerts.txt"]
    for version in (2, 3):
        view = fleet_view(hosts=40, spread=6.0, version=version, analysed=True)
        assert await sink.deliver(incident_delivery(view)) == DeliveryResult.ok()
    names = [f["name"] for f in fake.files_in_thread(card)]
    assert names == ["incident-inc1-alerts.txt", "incident-inc1-heat.png"]
    [heat] = [f for f in fake.files_in_thread(card) if f["name"].endswith(".png")]
    assert heat["mimetype"] == "image/png" and heat["title"].startswith("GPUTempCritical on 40 hosts")
    assert (fake.uploads[heat["id"]].data or b"").startswith(b"\x89PNG")


async def test_a_heat_map_that_cannot_be_uploaded_holds_nothing_back(fake: FakeSlack, make_sink: SinkFactory) -> None:
    metrics = Metrics()
    sink = make_sink(metrics)
    assert await sink.deliver(incident_delivery(fleet_view(hosts=10))) == DeliveryResult.ok()
    fake.fail_next("upload", status=503, times=20)
    for version in (2, 3, 4):  # retried with the deliveries a few times, then given up
        await sink.deliver(incident_delivery(fleet_view(hosts=10, version=version, analysed=True)))
    assert metrics.graphs.labels("upload_failed")._value.get() == 1
    [card] = fake.top_level()
    assert "Likely cause" in card.rendered_text() and len(fake.files_in_thread(card)) == 1  # the list only


async def test_the_share_takes_its_turn_in_its_methods_pace_not_behind_the_channels_posts(
    fake: FakeSlack, make_sink: SinkFactory, store: SqliteStore
) -> None:
    delivery = await stored_alert_delivery(store, "slack")
    async with running(FakeClock()) as clock:
        sink = make_sink(clock=clock, messages_per_second=1)
        assert await sink.deliver(delivery) == DeliveryResult.ok()
        # Slack limits files.completeUploadExternal per method and workspace: the share follows the post at once.
        assert clock.monotonic() == 0.0
    assert len(fake.files_in_thread(the_message(fake))) == 1


async def test_the_fake_takes_slack_sdks_own_three_step_upload_and_answers_its_errors(fake: FakeSlack) -> None:
    client = AsyncWebClient(token=DEFAULT_TOKEN, base_url=fake.api_url)
    parent = await client.chat_postMessage(channel="#gpu-alerts", text="alert")
    channel, ts = parent["channel"], parent["ts"]
    # slack_sdk's files_upload_v2 does the three steps itself: the fake speaks what it sends.
    await client.files_upload_v2(channel=channel, thread_ts=ts, content=b"\x89PNG-bytes", filename="g.png", title="G")
    [message] = [m for m in fake.top_level() if m.ts == ts]
    [shared] = fake.files_in_thread(message)
    assert (shared["title"], fake.uploads[shared["id"]].data) == ("G", b"\x89PNG-bytes")
    # Errors: a file never uploaded, a channel the bot is not in, an unknown upload URL, a wrong length.
    pending = await client.files_getUploadURLExternal(filename="x.png", length=3)
    with pytest.raises(SlackApiError, match="file_not_found"):
        await client.files_completeUploadExternal(files=[{"id": pending["file_id"]}], channel_id=channel)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{fake.url}/upload/v1/F-unknown", data=b"abc") as answer:
            assert answer.status == 404
        async with http.post(pending["upload_url"], data=b"abcd") as answer:
            assert answer.status == 400
        async with http.post(pending["upload_url"], data=b"abc") as answer:
            assert answer.status == 200
    fake.member_of = set()
    with pytest.raises(SlackApiError, match="not_in_channel"):
        await client.files_completeUploadExternal(files=[{"id": pending["file_id"]}], channel_id=channel, thread_ts=ts)


async def test_1200_gpus_on_150_hosts_are_5_posts_the_list_and_the_heat_map(
    fake: FakeSlack, make_sink: SinkFactory
) -> None:
    """The whole life of the incident: opened, analysed, recovered. Each chat.update shows a change."""
    sink = make_sink()
    for view in (
        fleet_view(),
        fleet_view(version=2, analysed=True),
        fleet_view(version=3, analysed=True),  # nothing new to show
        fleet_view(version=4, analysed=True, resolved=True),
    ):
        assert await sink.deliver(incident_delivery(view)) == DeliveryResult.ok()
    [card] = fake.top_level()
    assert len(fake.calls_of("chat.postMessage")) == 5  # the card, 3 replies of host lines, the recovery
    assert [f["mimetype"] for f in fake.files_in_thread(card)] == ["text/plain", "image/png"]
    # The card when analysed and when recovered; the 3 replies when their hosts recovered.
    assert len(fake.calls_of("chat.update")) == 5

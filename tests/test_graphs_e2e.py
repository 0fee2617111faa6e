"""One alert followed from Alertmanager's webhook to one Slack message and one image in its thread: the running
bot (ingest, worker, outbox, the graph worker process), a real Prometheus for the history, the fake Slack."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from PIL import Image

from tests.fakes.slack import FakeSlack
from tests.support.bot import eventually, running_bot
from tests.support.exporter import dcgm_labels
from tests.support.payloads import am_alert, webhook
from tests.support.slack_receiver import slack_receiver
from tests.test_prometheus_realstack import HOST, Stack, _wait_until, stack  # noqa: F401 (the module's fixture)

pytestmark = [pytest.mark.realstack, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with FakeSlack() as fake:
        yield fake


async def test_one_alert_one_message_and_one_image_in_its_thread(
    tmp_path: Path,
    slack: FakeSlack,
    stack: Stack,  # noqa: F811
) -> None:
    _wait_until(lambda: stack.instant('count_over_time(DCGM_FI_DEV_POWER_USAGE{gpu="5"}[1m]) > 4'))
    config = {
        "receivers": [slack_receiver(tmp_path, slack)],
        "routing": {"default": ["slack"]},
        "enrichment": {"prometheus": {"url": stack.prometheus.url, "history": "60s"}},
    }
    started = datetime.now(UTC) - timedelta(seconds=20)
    alert = am_alert("GPUPowerEnvelopeExceeded", starts_at=started, **{**dcgm_labels(5, hostname=HOST)})
    async with running_bot(tmp_path, config) as bot:
        async with httpx.AsyncClient() as client:
            response = await client.post(bot.webhook_url, json=webhook([alert]))
        assert response.status_code == 200
        [message] = await eventually(slack.top_level, timeout=30)
        [image] = await eventually(lambda: slack.files_in_thread(message), timeout=30)
        assert bot.metrics.graphs.labels("rendered")._value.get() == 1
    assert "GPUPowerEnvelopeExceeded" in message.text
    assert image["title"] == f"GPUPowerEnvelopeExceeded · {HOST} GPU 5"
    png = slack.uploads[image["id"]].data
    assert png is not None and Image.open(io.BytesIO(png)).size[0] == 800
    assert [c.method for c in slack.calls if c.method.startswith(("chat.", "files.", "upload"))] == [
        "chat.postMessage",
        "files.getUploadURLExternal",
        "upload",
        "files.completeUploadExternal",
    ]
    assert len(slack.messages) == 2

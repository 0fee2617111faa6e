"""The Alertmanager API v2 client against a real Alertmanager (Debian's 0.25): status, alerts, silences, HA."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from bot.alertmanager import (
    AlertmanagerClient,
    AlertmanagerError,
    PostableAlert,
    SilenceMatcher,
    SilenceNotFound,
    SilenceState,
)
from bot.config import AlertmanagerConfig
from tests.support.processes import Alertmanager, free_port, webhook_alertmanager_config

pytestmark = pytest.mark.realstack


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    am = Alertmanager(tmp_path_factory.mktemp("am"), webhook_alertmanager_config("http://127.0.0.1:9"))
    yield am
    am.stop()


@pytest.fixture
async def client(alertmanager: Alertmanager) -> AsyncIterator[AlertmanagerClient]:
    client = AlertmanagerClient([alertmanager.url], timeout=5)
    yield client
    await client.close()


def _hour() -> tuple[datetime, datetime]:
    now = datetime.now(UTC)
    return now, now + timedelta(hours=1)


async def _silence(client: AlertmanagerClient, host: str) -> str:
    starts, ends = _hour()
    return await client.create_silence(
        [SilenceMatcher(name="alertname", value="GPUXIDError"), SilenceMatcher(name="host", value=host)],
        starts_at=starts,
        ends_at=ends,
        created_by="alice",
        comment="reseating the GPU",
    )


async def test_status_names_the_version_and_the_replica_that_answered(
    client: AlertmanagerClient, alertmanager: Alertmanager
) -> None:
    status = await client.status()
    assert status.version.startswith("0.")
    assert status.url == alertmanager.url


async def test_a_silence_is_created_listed_and_expired(client: AlertmanagerClient, alertmanager: Alertmanager) -> None:
    silence_id = await _silence(client, "k-ai-01")

    assert silence_id in alertmanager.amtool("silence", "query", "-q").stdout.split()
    listed = {s.id: s for s in await client.silences(['host="k-ai-01"'])}
    assert listed[silence_id].state is SilenceState.ACTIVE
    assert listed[silence_id].created_by == "alice"
    assert str(listed[silence_id].matchers[1]) == 'host="k-ai-01"'

    await client.expire_silence(silence_id)
    assert (await client.silence(silence_id)).state is SilenceState.EXPIRED
    await client.expire_silence(silence_id)  # expiring again is harmless


async def test_an_unknown_silence_is_not_found_whatever_the_version_answers(client: AlertmanagerClient) -> None:
    with pytest.raises(SilenceNotFound):
        await client.expire_silence("1c15d9a4-b647-4090-b689-a35ba8dcc0ff")
    with pytest.raises(SilenceNotFound):
        await client.silence("1c15d9a4-b647-4090-b689-a35ba8dcc0ff")


async def test_a_silence_mutes_a_posted_alert(client: AlertmanagerClient) -> None:
    labels = {"alertname": "GPUXIDError", "host": "k-ai-02", "gpu": "3"}
    await client.post_alerts([PostableAlert(labels=labels, annotations={"summary": "Xid 79"})])
    silence_id = await _silence(client, "k-ai-02")

    [alert] = await client.alerts(['host="k-ai-02"'])
    assert alert.labels == labels
    assert alert.status.silenced_by == [silence_id]
    assert await client.alerts(['host="k-ai-02"'], silenced=False) == []


async def test_a_refused_request_is_not_tried_on_the_next_replica(alertmanager: Alertmanager) -> None:
    client = AlertmanagerClient([alertmanager.url, f"http://127.0.0.1:{free_port()}"], timeout=5)
    starts, ends = _hour()
    with pytest.raises(AlertmanagerError) as refused:
        await client.create_silence(
            [SilenceMatcher(name="host", value=".*", is_regex=True)],
            starts_at=starts,
            ends_at=ends,
            created_by="alice",
            comment="everything",
        )
    await client.close()
    assert refused.value.reason == "http_400"
    assert "empty string" in refused.value.detail


async def test_the_next_replica_answers_when_the_first_is_down(alertmanager: Alertmanager) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    client = AlertmanagerClient([down, alertmanager.url], timeout=5)
    silence_id = await _silence(client, "k-ai-03")
    status = await client.status()
    await client.close()
    assert status.url == alertmanager.url
    assert silence_id


async def test_no_replica_answering_says_which_failed() -> None:
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
    client = AlertmanagerClient(urls, timeout=2)
    with pytest.raises(AlertmanagerError) as failed:
        await client.status()
    await client.close()
    assert failed.value.reason == "connect"
    assert all(url in failed.value.detail for url in urls)


def test_no_url_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one"):
        AlertmanagerClient([])


async def test_the_configuration_names_the_replicas_and_the_token(tmp_path: Path, alertmanager: Alertmanager) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    config = AlertmanagerConfig.model_validate(
        {"urls": [alertmanager.url + "/"], "timeout": "3s", "bearer_token_file": "token"},
        context={"base_dir": tmp_path},
    )
    client = AlertmanagerClient.from_config(config)
    status = await client.status()
    await client.close()
    assert client.urls == [alertmanager.url]
    assert status.url == alertmanager.url


async def test_an_endless_answer_is_cut_and_the_next_replica_asked(alertmanager: Alertmanager) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(10_000):
                await response.write(b"[" * 65536)
        return response

    app = web.Application()
    app.router.add_get("/api/v2/status", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        hostile = f"http://127.0.0.1:{port}"
        client = AlertmanagerClient([hostile], timeout=5, max_answer_bytes=1024 * 1024)
        with pytest.raises(AlertmanagerError) as cut:
            await client.status()
        await client.close()
        assert cut.value.reason == "too_large"
        assert "answer over 1 MB" in cut.value.detail

        client = AlertmanagerClient([hostile, alertmanager.url], timeout=5, max_answer_bytes=1024 * 1024)
        assert (await client.status()).url == alertmanager.url
        await client.close()
    finally:
        await runner.cleanup()

"""POST /alertmanager: what is accepted, what is refused (4xx, JSON error) and that the service keeps serving."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.ingest import RejectionLog
from bot.models import WebhookPayload
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.payloads import am_alert, body, capture_files, distinct_webhooks, gpu_alerts, load_capture, webhook

JSON = {"Content-Type": "application/json"}


async def _post(bot: RunningBot, data: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(bot.webhook_url, content=data, headers=JSON if headers is None else headers)


async def _still_serving(bot: RunningBot, group: str) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        assert (await client.get(f"{bot.url}/healthz")).status_code == 200
    fresh = body(webhook([am_alert(host=group)], group_key=f"{{}}:{{host={group!r}}}"))
    response = await _post(bot, fresh)
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "accepted"


@pytest.fixture
async def bot(tmp_path: Path) -> AsyncIterator[RunningBot]:
    async with running_bot(tmp_path) as running:
        yield running


@pytest.mark.parametrize("path", capture_files(), ids=lambda p: f"{p.parent.parent.name}:{p.stem}")
async def test_real_capture_bodies_are_accepted_and_stored(bot: RunningBot, path: Path) -> None:
    headers, raw = load_capture(path)
    response = await _post(bot, raw, {"Content-Type": headers["Content-Type"], "User-Agent": headers["User-Agent"]})
    assert response.status_code == 200
    payload = WebhookPayload.model_validate_json(raw)
    assert response.json() == {"status": "accepted", "alerts": len(payload.alerts)}
    stored = await eventually(lambda: bot.runtime.store.get_alert(payload.alerts[0].key))
    assert stored.receiver == payload.receiver_name
    assert stored.group_key == payload.group_key
    assert bot.metric("gpu_alert_bot_notifications_received_total") == 1


def _valid() -> dict[str, Any]:
    return webhook([am_alert(gpu="0")])


def _with(change: dict[str, Any], *, alert: dict[str, Any] | None = None, drop: str | None = None) -> bytes:
    payload = {**_valid(), **change}
    if alert is not None:
        payload["alerts"] = [{**payload["alerts"][0], **alert}]
    if drop is not None:
        payload.pop(drop)
    return body(payload)


BAD_INPUTS = [
    pytest.param(b'{"version": "4", "alerts": [', JSON, 400, "invalid_json", None, id="invalid-json"),
    pytest.param(b"", JSON, 400, "invalid_json", None, id="empty-body"),
    pytest.param(b"\xff\xfe\x00garbage", JSON, 400, "invalid_json", None, id="not-utf8"),
    pytest.param(body(_valid()), {"Content-Type": "text/plain"}, 415, "unsupported_media_type", None, id="text-plain"),
    pytest.param(body(_valid()), {}, 415, "unsupported_media_type", None, id="no-content-type"),
    pytest.param(b"[]", JSON, 400, "invalid_payload", "", id="json-array"),
    pytest.param(_with({}, drop="groupKey"), JSON, 400, "invalid_payload", "groupKey", id="missing-groupKey"),
    pytest.param(_with({}, drop="alerts"), JSON, 400, "invalid_payload", "alerts", id="missing-alerts"),
    pytest.param(_with({"alerts": {"a": 1}}), JSON, 400, "invalid_payload", "alerts", id="alerts-not-a-list"),
    pytest.param(_with({"alerts": "x"}), JSON, 400, "invalid_payload", "alerts", id="alerts-a-string"),
    pytest.param(_with({"status": "warning"}), JSON, 400, "invalid_payload", "status", id="bad-top-status"),
    pytest.param(
        _with({}, alert={"status": "pending"}), JSON, 400, "invalid_payload", "alerts.0.status", id="bad-alert-status"
    ),
    pytest.param(
        _with({}, alert={"startsAt": "yesterday"}), JSON, 400, "invalid_payload", "alerts.0.startsAt", id="bad-start"
    ),
    pytest.param(
        _with({}, alert={"endsAt": "2026-11-29 25:00"}), JSON, 400, "invalid_payload", "alerts.0.endsAt", id="bad-end"
    ),
    pytest.param(
        _with({}, alert={"startsAt": "0001-01-01T00:00:00+01:00"}),
        JSON,
        400,
        "invalid_payload",
        "alerts.0.startsAt",
        id="start-out-of-range",
    ),
    pytest.param(
        _with({}, alert={"startsAt": "0001-01-01T00:00:00Z"}),
        JSON,
        400,
        "invalid_payload",
        "alerts.0.startsAt",
        id="start-go-zero-time",
    ),
    pytest.param(
        _with({}, alert={"labels": {"gpu": 3}}), JSON, 400, "invalid_payload", "alerts.0.labels.gpu", id="label-number"
    ),
    pytest.param(
        _with({}, alert={"fingerprint": ""}), JSON, 400, "invalid_payload", "alerts.0.fingerprint", id="no-fingerprint"
    ),
]


def _rejections(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "bot.ingest" and r.getMessage().startswith("rejected a webhook")]


@pytest.mark.parametrize(("data", "headers", "status", "error", "field"), BAD_INPUTS)
async def test_bad_input_gets_a_clear_4xx_json_error_and_the_service_keeps_serving(
    bot: RunningBot,
    caplog: pytest.LogCaptureFixture,
    data: bytes,
    headers: dict[str, str],
    status: int,
    error: str,
    field: str | None,
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    response = await _post(bot, data, headers)
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    answer = response.json()
    assert answer["error"] == error
    assert answer["message"]
    if field is not None:
        assert field in [d["field"] for d in answer["details"]], answer["details"]
    assert bot.metric("gpu_alert_bot_errors_total", {"kind": error}) == 1
    [line] = _rejections(caplog)
    assert line.levelno == logging.WARNING
    assert (line.status, line.reason, line.peer) == (status, error, "127.0.0.1")  # type: ignore[attr-defined]
    assert line.detail and line.suppressed == 0  # type: ignore[attr-defined]
    if field:
        assert field in line.detail  # type: ignore[attr-defined]
    await _still_serving(bot, "after-bad-input")


async def test_a_rejection_line_never_carries_the_body(bot: RunningBot, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    secret_text = "hunter2-in-the-annotations"
    invalid = _with({"status": "warning"}, alert={"annotations": {"description": secret_text}})
    assert (await _post(bot, invalid)).status_code == 400
    assert (await _post(bot, invalid[:-5])).status_code == 400
    assert (await _post(bot, invalid, {"Content-Type": "text/plain"})).status_code == 415
    lines = _rejections(caplog)
    assert [line.reason for line in lines] == ["invalid_payload", "invalid_json", "unsupported_media_type"]  # type: ignore[attr-defined]
    for line in lines:
        assert secret_text not in f"{line.getMessage()} {vars(line)}"


async def test_a_retried_bad_webhook_is_logged_once_per_reason_with_every_one_counted(
    bot: RunningBot, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    for _ in range(5):
        assert (await _post(bot, b"{")).status_code == 400
    for _ in range(3):
        assert (await _post(bot, b"[]")).status_code == 400
    assert [line.reason for line in _rejections(caplog)] == ["invalid_json", "invalid_payload"]  # type: ignore[attr-defined]
    assert bot.metric("gpu_alert_bot_errors_total", {"kind": "invalid_json"}) == 5
    assert bot.metric("gpu_alert_bot_errors_total", {"kind": "invalid_payload"}) == 3


def test_the_rejection_log_reports_what_it_left_out_once_the_interval_has_passed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    now = [1000.0]
    rejections = RejectionLog(interval=60.0, clock=lambda: now[0])
    for _ in range(4):
        rejections.rejected("10.0.0.7", 401, "unauthorized", "missing or wrong credentials", scheme="bearer")
        now[0] += 10
    rejections.rejected("10.0.0.7", 413, "too_large", "Content-Length 99999999")
    now[0] += 30  # 70 s after the first line
    rejections.rejected("10.0.0.8", 401, "unauthorized", "missing or wrong credentials", scheme="none")
    lines = _rejections(caplog)
    assert [(r.reason, r.suppressed, r.peer) for r in lines] == [  # type: ignore[attr-defined]
        ("unauthorized", 0, "10.0.0.7"),
        ("too_large", 0, "10.0.0.7"),
        ("unauthorized", 3, "10.0.0.8"),
    ]
    assert lines[2].scheme == "none" and lines[2].status == 401  # type: ignore[attr-defined]


async def test_unknown_version_whose_fields_validate_is_accepted_with_a_warning(
    bot: RunningBot, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    response = await _post(bot, body(webhook([am_alert()], version="5")))
    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    assert bot.metric("gpu_alert_bot_unknown_payload_version_total", {"version": "5"}) == 1
    warning = next(r for r in caplog.records if "unknown payload version" in r.getMessage())
    assert warning.levelno == logging.WARNING
    assert warning.version == "5"  # type: ignore[attr-defined]
    await eventually(lambda: [e for e in bot.console_events() if e["event"] == "firing"])


async def test_a_notification_without_alerts_is_answered_and_not_stored(bot: RunningBot) -> None:
    response = await _post(bot, body(webhook([])))
    assert response.status_code == 200
    assert response.json()["status"] == "ignored"
    assert bot.metric("gpu_alert_bot_notifications_received_total") == 0


async def test_a_group_larger_than_aiohttps_default_limit_is_accepted(bot: RunningBot) -> None:
    # 1 MiB is aiohttp's default client_max_size; a 413 is a 4xx Alertmanager never retries within a flush.
    alerts = gpu_alerts(2500, host="big-node", annotations={"description": "x" * 300})
    data = body(webhook(alerts, group_key='{}:{host="big-node"}'))
    assert len(data) > 1024 * 1024
    response = await _post(bot, data)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "accepted", "alerts": 2500}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_the_configured_limit_is_413_json(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, chunked: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    async with running_bot(tmp_path, {"server": {"max_body_bytes": 4096}}) as bot:
        data = body(webhook(gpu_alerts(40, annotations={"description": "y" * 100})))
        assert len(data) > 4096

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(data), 1000):
                yield data[start : start + 1000]

        async with httpx.AsyncClient(timeout=10) as client:
            content: Any = chunks() if chunked else data
            response = await client.post(bot.webhook_url, content=content, headers=JSON)
        assert response.status_code == 413
        assert response.json()["error"] == "too_large"
        assert "max_body_bytes" in response.json()["message"]
        assert bot.metric("gpu_alert_bot_errors_total", {"kind": "too_large"}) == 1
        [line] = _rejections(caplog)
        assert (line.status, line.reason) == (413, "too_large")  # type: ignore[attr-defined]
        assert "chunked" in line.detail if chunked else str(len(data)) in line.detail  # type: ignore[attr-defined]
        await _still_serving(bot, "after-too-large")


async def test_resend_and_ha_copy_are_acknowledged_as_duplicates(bot: RunningBot) -> None:
    payload = webhook(gpu_alerts(3), external_url="http://am-0:9093")
    first = await _post(bot, body(payload))
    assert first.json()["status"] == "accepted"
    resend = await _post(bot, body(payload))
    ha_copy = await _post(bot, body({**payload, "externalURL": "http://am-1:9093", "alerts": payload["alerts"][::-1]}))
    for response in (resend, ha_copy):
        assert response.status_code == 200  # a 2xx, or Alertmanager would keep re-sending it
        assert response.json()["status"] == "duplicate"
    assert bot.metric("gpu_alert_bot_duplicate_notifications_total") == 2
    assert bot.metric("gpu_alert_bot_notifications_received_total") == 1
    # Events go out in the order they were stored: once a later notification's alert is out, whatever the copies
    # had made would be out too.
    later = await _post(bot, body(webhook([am_alert(host="k-ai-99")], group_key="later")))
    assert later.json()["status"] == "accepted"
    events = await eventually(lambda: len(bot.console_events()) >= 4 and bot.console_events())
    assert len(events) == 4 and "k-ai-99" in json.dumps(events[-1])


async def test_method_and_path_errors_are_json(bot: RunningBot) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        wrong_method = await client.get(bot.webhook_url)
        missing = await client.post(f"{bot.url}/nope", content=b"{}", headers=JSON)
    assert wrong_method.status_code == 405 and wrong_method.json()["error"] == "method_not_allowed"
    assert "POST" in wrong_method.headers["Allow"]
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


async def test_a_post_to_another_path_says_where_the_webhook_is_and_is_counted_and_logged(
    bot: RunningBot, caplog: pytest.LogCaptureFixture
) -> None:
    """Alertmanager's `url: http://gpu-alert-bot:9095` (no path) or a trailing slash: its notifications are lost,
    so the bot says where the webhook is, counts it for GPUAlertBotWebhooksRefused and logs it."""
    caplog.set_level(logging.WARNING, logger="bot.ingest")
    async with httpx.AsyncClient(timeout=10) as client:
        answers = [
            await client.post(f"{bot.url}{path}", content=body(_valid()), headers=JSON)
            for path in ("/", "/alertmanager/", "/api/v2/alerts")
        ]
        unknown_get = await client.get(f"{bot.url}/nope")
    for answer in answers:
        assert answer.status_code == 404
        assert answer.json()["error"] == "not_found"
        assert answer.json()["webhook_path"] == "/alertmanager"
        assert "/alertmanager" in answer.json()["message"]
    assert unknown_get.status_code == 404 and unknown_get.json()["error"] == "not_found"
    assert bot.metric("gpu_alert_bot_errors_total", {"kind": "not_found"}) == 3
    [line] = _rejections(caplog)
    assert (line.status, line.reason, line.peer) == (404, "not_found", "127.0.0.1")  # type: ignore[attr-defined]
    assert "'/'" in line.detail and "/alertmanager" in line.detail  # type: ignore[attr-defined]
    assert bot.metric("gpu_alert_bot_notifications_received_total") == 0


async def test_ingest_metrics_are_exported(bot: RunningBot) -> None:
    payloads = list(distinct_webhooks(3, 2))
    for payload in [*payloads, payloads[0]]:
        assert (await _post(bot, body(payload))).status_code == 200
    await _post(bot, b"{", JSON)
    # Every alert routed (the sixth of one name within a minute opens an incident: fewer console lines than alerts).
    await eventually(lambda: bot.metric("gpu_alert_bot_events_total", {"kind": "firing"}) == 6)
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(f"{bot.url}/metrics")).text
    for line in (
        "gpu_alert_bot_notifications_received_total 3.0",
        "gpu_alert_bot_duplicate_notifications_total 1.0",
        'gpu_alert_bot_alerts_received_total{status="firing"} 6.0',
        "gpu_alert_bot_ingest_duration_seconds_count 5.0",
        'gpu_alert_bot_errors_total{kind="invalid_json"} 1.0',
        'gpu_alert_bot_queue_depth{queue="notifications"}',
        'gpu_alert_bot_alerts{status="firing"}',
        'gpu_alert_bot_events_total{kind="firing"} 6.0',
        'gpu_alert_bot_deliveries_total{receiver="console",result="delivered"}',
    ):
        assert line in text, line


# --- generated input: nothing an HTTP client sends may produce a 500 --------------------------------------------
_text = st.text(max_size=12)
_json_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text
_json = st.recursive(
    _json_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3)
)
_timestamps = (
    st.sampled_from(
        [
            "2026-11-29T13:31:59.59202753Z",
            "0001-01-01T00:00:00Z",
            "0001-01-01T00:00:00+01:00",
            "9999-12-31T23:59:59-23:59",
        ]
    )
    | st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat())
    | _json
)
_alerts = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved"]) | _json,
        "labels": st.dictionaries(_text, _text, max_size=3) | _json,
        "startsAt": _timestamps,
        "fingerprint": st.sampled_from(["ea7d2357f640d0c0", "9a99648b5264842f"]) | _text,
    },
    optional={"endsAt": _timestamps, "annotations": st.dictionaries(_text, _text, max_size=2), "generatorURL": _json},
)
_payloads = st.fixed_dictionaries(
    {
        "version": st.sampled_from(["4", "5", ""]) | _json,
        "groupKey": _text | _json,
        "status": st.sampled_from(["firing", "resolved"]) | _json,
        "receiver": _text,
        "alerts": st.lists(_alerts, max_size=4) | _json,
    },
    optional={"truncatedAlerts": st.integers() | _json, "externalURL": _text, "groupLabels": _json},
)
_GENERATED = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _never_500(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    assert response.headers["Content-Type"].startswith("application/json"), response.text
    if response.status_code >= 400:
        assert response.json()["error"]


async def test_generated_payloads_never_produce_a_500(bot: RunningBot) -> None:
    with httpx.Client(timeout=10) as client:

        @_GENERATED
        @given(payload=_payloads)
        def structured(payload: dict[str, Any]) -> None:
            _never_500(client.post(bot.webhook_url, content=json.dumps(payload).encode(), headers=JSON))

        await asyncio.to_thread(structured)
    assert bot.metric("gpu_alert_bot_errors_total", {"kind": "internal"}) == 0
    await _still_serving(bot, "after-generated")


async def test_generated_raw_bytes_never_produce_a_500(bot: RunningBot) -> None:
    with httpx.Client(timeout=10) as client:

        @_GENERATED
        @given(data=st.binary(max_size=300) | _json.map(lambda v: json.dumps(v).encode()), utf8=st.booleans())
        def raw(data: bytes, utf8: bool) -> None:
            headers = {"Content-Type": "application/json; charset=utf-8" if utf8 else "application/json"}
            _never_500(client.post(bot.webhook_url, content=data, headers=headers))

        await asyncio.to_thread(raw)
    assert bot.metric("gpu_alert_bot_errors_total", {"kind": "internal"}) == 0
    await _still_serving(bot, "after-raw")

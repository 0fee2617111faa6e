"""Alertmanager's webhook payload as the models read it: real captures, and every quirk of protocols.md §1/§9."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.models import AmAlert, WebhookPayload, alert_key, host_from_labels
from tests.support.payloads import (
    FIXTURE_CAPTURES,
    SHARED_CAPTURES,
    am_alert,
    body,
    capture_files,
    load_capture,
    webhook,
)


def _capture_id(path: Path) -> str:
    return f"{'repo' if path.parent == FIXTURE_CAPTURES else 'shared'}:{path.stem}"


CAPTURES = capture_files()


def test_captures_are_found_in_both_places() -> None:
    repo = [p for p in CAPTURES if p.parent == FIXTURE_CAPTURES]
    assert len(repo) >= 4
    if SHARED_CAPTURES.is_dir():
        shared = sorted(SHARED_CAPTURES.glob("*.json"))
        # The repository keeps a copy of every shared capture, so the suite runs without ../shared.
        for path in shared:
            assert (FIXTURE_CAPTURES / path.name).read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("path", CAPTURES, ids=_capture_id)
def test_every_real_capture_parses(path: Path) -> None:
    headers, raw = load_capture(path)
    payload = WebhookPayload.model_validate_json(raw)
    expected = json.loads(raw)
    assert headers["Content-Type"] == "application/json"
    assert payload.version == "4"
    assert payload.group_key == expected["groupKey"]
    assert payload.truncated_alerts == expected["truncatedAlerts"]
    assert len(payload.alerts) == len(expected["alerts"])
    for alert, sent in zip(payload.alerts, expected["alerts"], strict=True):
        assert alert.fingerprint == sent["fingerprint"]
        assert alert.labels == sent["labels"]
        assert alert.starts_at.tzinfo is not None
        if sent["endsAt"].startswith("0001-01-01"):
            assert alert.ends_at is None
        else:
            assert alert.ends_at is not None and alert.ends_at > alert.starts_at
    assert "\\" not in payload.receiver_name


def _capture(name: str) -> WebhookPayload:
    return WebhookPayload.model_validate_json(load_capture(FIXTURE_CAPTURES / name)[1])


def test_receiver_name_is_unescaped_from_regexp_quote_meta() -> None:
    payload = _capture("am025_webhook_firing_truncated.json")
    assert payload.receiver == "web\\.hook"
    assert payload.receiver_name == "web.hook"
    quoted = WebhookPayload.model_validate_json(body(webhook([am_alert()], receiver=r"gpu\-alerts\(eu\)\[1\]")))
    assert quoted.receiver_name == "gpu-alerts(eu)[1]"


def test_go_zero_end_time_means_no_end() -> None:
    firing = _capture("am025_webhook_firing_truncated.json")
    assert [a.ends_at for a in firing.alerts] == [None, None]
    resolved = _capture("am025_webhook_resolved.json")
    assert resolved.alerts[0].ends_at == datetime(2026, 11, 29, 13, 32, 59, 592027, tzinfo=UTC)


def test_eight_and_nine_fractional_digits_and_milliseconds() -> None:
    truncated = _capture("am025_webhook_firing_truncated.json")
    assert truncated.alerts[0].starts_at == datetime(2026, 11, 29, 13, 31, 59, 592027, tzinfo=UTC)  # 8 digits
    assert truncated.alerts[1].starts_at == datetime(2026, 11, 29, 13, 31, 59, 598959, tzinfo=UTC)  # 9 digits
    prometheus = _capture("prom242_am025_e2e_firing.json")
    assert prometheus.alerts[0].starts_at == datetime(2026, 11, 29, 13, 35, 46, 841000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("sent", "instant"),
    [
        ("2026-11-29T13:31:59Z", datetime(2026, 11, 29, 13, 31, 59, tzinfo=UTC)),
        ("2026-11-29T13:31:59.5Z", datetime(2026, 11, 29, 13, 31, 59, 500000, tzinfo=UTC)),
        ("2019-01-22T11:47:17.113904445+08:00", datetime(2019, 1, 22, 3, 47, 17, 113904, tzinfo=UTC)),
        ("2026-11-29T08:31:59-05:00", datetime(2026, 11, 29, 13, 31, 59, tzinfo=UTC)),
    ],
)
def test_timestamps_with_any_precision_and_offset_become_utc(sent: str, instant: datetime) -> None:
    alert = AmAlert.model_validate_json(json.dumps({**am_alert(), "startsAt": sent}))
    assert alert.starts_at == instant
    assert alert.starts_at.utcoffset() == timedelta(0)
    assert alert.key.endswith(instant.isoformat())


@pytest.mark.parametrize(
    "sent", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "yesterday", "2026-13-01T00:00:00Z", 1700000000]
)
def test_timestamps_out_of_range_or_malformed_are_rejected(sent: object) -> None:
    with pytest.raises(ValidationError):
        AmAlert.model_validate_json(json.dumps({**am_alert(), "startsAt": sent}))


def test_timestamp_without_offset_is_rejected() -> None:
    with pytest.raises(ValidationError, match="timezone"):
        AmAlert.model_validate_json(json.dumps({**am_alert(), "startsAt": "2026-11-29T13:31:59"}))


def test_empty_generator_url_and_truncated_alerts() -> None:
    payload = _capture("am025_webhook_firing_truncated.json")
    assert payload.truncated_alerts == 1
    assert payload.alerts[1].generator_url == ""
    assert payload.alerts[0].generator_url.startswith("http://prom:9090/graph?g0.expr=")


def test_fields_of_later_alertmanager_versions_are_ignored() -> None:
    raw = body(
        webhook([am_alert()], notification_reason="repeat interval elapsed", routeLabels={"team": "gpu"}, extra=1)
    )
    assert WebhookPayload.model_validate_json(raw).alerts[0].labels["alertname"] == "GPUXidError"


def test_optional_fields_may_be_absent() -> None:
    minimal = {
        "version": "4",
        "groupKey": "{}:{}",
        "status": "firing",
        "receiver": "bot",
        "alerts": [
            {"status": "firing", "labels": {"alertname": "X"}, "startsAt": "2026-01-01T00:00:00Z", "fingerprint": "ab"}
        ],
    }
    payload = WebhookPayload.model_validate_json(json.dumps(minimal))
    assert payload.truncated_alerts == 0 and payload.external_url == ""
    assert payload.alerts[0].ends_at is None and payload.alerts[0].annotations == {}


class TestIdempotencyKey:
    def test_ignores_external_url_and_alert_order(self) -> None:
        alerts = [am_alert(gpu="0"), am_alert(gpu="1")]
        first = WebhookPayload.model_validate_json(body(webhook(alerts, external_url="http://am-0:9093")))
        replica = WebhookPayload.model_validate_json(body(webhook(alerts[::-1], external_url="http://am-1:9093")))
        assert first.idempotency_key() == replica.idempotency_key()

    def test_ignores_annotation_changes_of_the_same_alerts(self) -> None:
        before = WebhookPayload.model_validate_json(body(webhook([am_alert(annotations={"value": "81"})])))
        after = WebhookPayload.model_validate_json(body(webhook([am_alert(annotations={"value": "83"})])))
        assert before.idempotency_key() == after.idempotency_key()

    @pytest.mark.parametrize(
        "changed",
        [
            webhook([am_alert(gpu="0", status="resolved")]),
            webhook([am_alert(gpu="0", starts_at=datetime(2026, 11, 30, tzinfo=UTC))]),
            webhook([am_alert(gpu="1")]),
            webhook([am_alert(gpu="0"), am_alert(gpu="1")]),
            webhook([am_alert(gpu="0")], group_key='{}:{alertname="Other"}'),
        ],
        ids=["status", "startsAt", "fingerprint", "new-member", "groupKey"],
    )
    def test_changes_with_status_start_fingerprint_members_and_group(self, changed: dict[str, object]) -> None:
        original = WebhookPayload.model_validate_json(body(webhook([am_alert(gpu="0")])))
        assert WebhookPayload.model_validate_json(body(changed)).idempotency_key() != original.idempotency_key()

    def test_same_instant_in_another_offset_is_the_same_key(self) -> None:
        utc = webhook([am_alert()])
        shifted = json.loads(json.dumps(utc))
        shifted["alerts"][0]["startsAt"] = "2026-11-29T14:31:59.592027+01:00"
        assert (
            WebhookPayload.model_validate_json(body(utc)).idempotency_key()
            == WebhookPayload.model_validate_json(body(shifted)).idempotency_key()
        )


def test_alert_key_is_fingerprint_and_start_of_the_episode() -> None:
    start = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)
    assert alert_key("ea7d2357f640d0c0", start) == "ea7d2357f640d0c0@2026-11-29T14:00:00+00:00"


@pytest.mark.parametrize(
    ("labels", "host"),
    [
        ({"Hostname": "k-ai-01", "instance": "10.0.0.1:9400"}, "k-ai-01"),
        # dcgm-exporter in a container without a hostname reports the container ID; prometheus.yml's `host` wins
        ({"Hostname": "3f2a9c1e77b0", "host": "k-ai-01.lan", "instance": "k-ai-01.lan:9400"}, "k-ai-01.lan"),
        ({"instance": "10.0.0.1:9400"}, "10.0.0.1"),
        ({"instance": "[::1]:9400"}, "::1"),
        ({"instance": "k-ai-02"}, "k-ai-02"),
        ({"host": " gpu01 "}, "gpu01"),
        ({}, ""),
    ],
)
def test_host_from_labels(labels: dict[str, str], host: str) -> None:
    assert host_from_labels(labels) == host

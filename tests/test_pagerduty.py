"""PagerDuty Events API v2: the event body (dedup_key, limits, severity, details) and the sink's handling of every
answer, against the loopback fake in tests/fakes/pagerduty.py (which is itself checked against the documented
validation rules)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.config import ConfigError, PagerDutyReceiver, load_config
from bot.message import Fact, Message, Section
from bot.models import Delivery
from bot.render.pagerduty import (
    DEDUP_KEY_LIMIT,
    EVENT_SIZE_LIMIT,
    SUMMARY_LIMIT,
    dedup_key,
    encode_event,
    pagerduty_event,
)
from bot.sinks.pagerduty import PagerDutySink, classify_response
from bot.store import Store
from tests.fakes.pagerduty import FakePagerDuty
from tests.support.messages import STARTED, delivery_of, sample_message
from tests.support.processes import free_port

ROUTING_KEY = "0123456789abcdef0123456789abcdef"


def message(event: str = "firing", **changes: Any) -> Message:
    minimal = {
        "summary": "Xid 79: GPU fell off the bus",
        "facts": [Fact(label="Host", value="k-ai-01")],
        "sections": [Section(title="Runbook", kind="steps", lines=["Drain the node"])],
        "labels": {"alertname": "GPUXidError", "severity": "critical", "host": "k-ai-01", "cluster": "train-a"},
    }
    return sample_message(event, **{**minimal, **changes})


def receiver(tmp_path: Path, **options: Any) -> PagerDutyReceiver:
    key = tmp_path / "routing_key"
    key.write_text(ROUTING_KEY + "\n")
    data: dict[str, Any] = {"type": "pagerduty", "name": "pd", "routing_key_file": str(key), "timeout": 5}
    data.update(options)
    return PagerDutyReceiver.model_validate(data)


def delivery(msg: Message) -> Delivery:
    return delivery_of(msg, "pd")


@pytest.fixture
async def fake() -> AsyncIterator[FakePagerDuty]:
    async with FakePagerDuty() as started:
        yield started


async def deliver(config: PagerDutyReceiver, msg: Message, fake: FakePagerDuty, store: Store) -> Any:
    """Delivers through a transport that takes every request to the fake, whatever the configured URL."""
    sink = PagerDutySink(config, store, transport=fake.transport())
    try:
        return await sink.deliver(delivery(msg))
    finally:
        await sink.close()


# --- the event body ------------------------------------------------------------------------------------
def test_trigger_event_fields(tmp_path: Path) -> None:
    config = receiver(tmp_path, client_url="http://alertmanager:9093")
    event = pagerduty_event(message(), config, ROUTING_KEY)
    assert event is not None
    assert event["event_action"] == "trigger" and event["routing_key"] == ROUTING_KEY
    payload = event["payload"]
    assert payload["summary"] == "GPUXidError on k-ai-01 GPU 3: Xid 79: GPU fell off the bus"
    assert (payload["source"], payload["component"], payload["class"]) == ("k-ai-01", "GPU 3", "GPUXidError")
    assert (payload["severity"], payload["group"]) == ("critical", "train-a")
    assert payload["timestamp"] == STARTED.isoformat()
    assert payload["custom_details"]["enrichment"]["loki"] == {"entries": [["t", "NVRM: Xid 79"]]}
    assert payload["custom_details"]["sections"] == {"Runbook": ["Drain the node"]}
    assert event["links"] == [{"href": "https://runbooks.example/xid", "text": "Runbook"}]
    assert (event["client"], event["client_url"]) == ("gpu-alert-bot", "http://alertmanager:9093")


def test_dedup_key_is_the_episode_for_trigger_acknowledge_and_resolve(tmp_path: Path) -> None:
    config = receiver(tmp_path)
    events = [pagerduty_event(message(event), config, ROUTING_KEY) for event in ("firing", "ack", "resolved")]
    assert [e["event_action"] for e in events if e] == ["trigger", "acknowledge", "resolve"]
    assert {e["dedup_key"] for e in events if e} == {message().alert_key}
    # Follow-ups are just the three fields, as PagerDuty documents them.
    assert events[2] == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": message().alert_key}
    assert pagerduty_event(message(alert_key="other@2026"), config, ROUTING_KEY)["dedup_key"] != message().alert_key


def test_repeats_send_nothing(tmp_path: Path) -> None:
    assert pagerduty_event(message("repeat", times_seen=4), receiver(tmp_path), ROUTING_KEY) is None


def test_an_overlong_alert_key_still_gives_a_valid_stable_dedup_key() -> None:
    long_key = "f" * 300 + "@2026-11-29T13:31:59+00:00"
    key = dedup_key(message(alert_key=long_key))
    assert len(key) <= DEDUP_KEY_LIMIT and key == dedup_key(message(alert_key=long_key))


def test_summary_is_cut_to_1024_characters_with_an_ellipsis(tmp_path: Path) -> None:
    event = pagerduty_event(message(summary="é" * 5000), receiver(tmp_path), ROUTING_KEY)
    summary = event["payload"]["summary"]
    assert len(summary) == SUMMARY_LIMIT and summary.endswith("…")


@pytest.mark.parametrize(
    ("severity", "expected"),
    [("critical", "critical"), ("Warning", "warning"), ("INFO", "info"), ("page", "critical"), ("", "error")],
)
def test_severity_is_mapped_case_insensitively_with_a_default(tmp_path: Path, severity: str, expected: str) -> None:
    mapping = {"critical": "critical", "warning": "warning", "info": "info", "Page": "critical"}
    config = receiver(tmp_path, severity_map=mapping)
    event = pagerduty_event(message(severity=severity), config, ROUTING_KEY)
    assert event["payload"]["severity"] == expected


def test_a_verdict_lowers_the_pagerduty_severity_only_when_the_receiver_asks(tmp_path: Path) -> None:
    stale = message(severity="info", alert_severity="critical")
    assert pagerduty_event(stale, receiver(tmp_path), ROUTING_KEY)["payload"]["severity"] == "critical"
    lowered = receiver(tmp_path, downgrade_on_verdict=True)
    assert pagerduty_event(stale, lowered, ROUTING_KEY)["payload"]["severity"] == "info"


def test_unknown_severity_uses_the_configured_default(tmp_path: Path) -> None:
    config = receiver(tmp_path, default_severity="warning")
    assert pagerduty_event(message(severity="sev9"), config, ROUTING_KEY)["payload"]["severity"] == "warning"


async def test_huge_enrichment_is_trimmed_under_the_512_kb_limit_and_accepted(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    lines = [["2026-11-29T13:31:00Z", "NVRM: Xid (PCI:0000:3b:00): 79 " + "x" * 200] for _ in range(5000)]
    big = message(details={"loki": {"entries": lines}, "prometheus": {"expr": "up"}, "playbook": "gpu_xid"})
    event = pagerduty_event(big, receiver(tmp_path), ROUTING_KEY)
    assert event is not None
    assert len(encode_event(event)) <= EVENT_SIZE_LIMIT
    enrichment = event["payload"]["custom_details"]["enrichment"]
    assert enrichment["loki"].startswith("left out: ")
    assert enrichment["prometheus"] == {"expr": "up"} and enrichment["playbook"] == "gpu_xid"
    assert event["payload"]["custom_details"]["labels"]["host"] == "k-ai-01"
    assert (await deliver(receiver(tmp_path), big, fake, store)).delivered


def test_routing_key_must_be_32_characters_and_is_never_shown(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("short-key-value\n")
    (tmp_path / "bot.yaml").write_text(
        json.dumps({"receivers": [{"type": "pagerduty", "name": "pd", "routing_key_file": "key"}]})
    )
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "bot.yaml")
    assert "32-character" in str(error.value) and "short-key-value" not in str(error.value)


# --- the sink against the fake ---------------------------------------------------------------------------
async def test_trigger_acknowledge_resolve_drive_one_alert(tmp_path: Path, fake: FakePagerDuty, store: Store) -> None:
    config = receiver(tmp_path)
    assert (await deliver(config, message(), fake, store)).delivered
    assert fake.current(message().alert_key).status == "triggered"
    assert (await deliver(config, message("ack", acked_by="alice"), fake, store)).delivered
    assert fake.current(message().alert_key).status == "acknowledged"
    assert (await deliver(config, message("resolved"), fake, store)).delivered
    assert fake.current(message().alert_key).status == "resolved"
    assert len(fake.alerts[message().alert_key]) == 1


async def test_firing_again_after_a_resolve_opens_a_new_incident_on_the_same_key(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    config = receiver(tmp_path)
    for event in ("firing", "resolved", "refiring"):
        assert (await deliver(config, message(event), fake, store)).delivered
    first, second = fake.alerts[message().alert_key]
    assert (first.status, second.status) == ("resolved", "triggered")


async def test_400_fails_for_good_with_pagerdutys_errors(tmp_path: Path, fake: FakePagerDuty, store: Store) -> None:
    fake.fail_next(1, "invalid")
    result = await deliver(receiver(tmp_path), message(), fake, store)
    assert (result.delivered, result.retry, result.reason) == (False, False, "invalid_event")
    assert "Event object is invalid" in result.detail and "Event rejected by test" in result.detail
    assert ROUTING_KEY not in result.detail


async def test_429_is_retried_after_the_configured_delay(tmp_path: Path, fake: FakePagerDuty, store: Store) -> None:
    fake.fail_next(1, "429")
    result = await deliver(receiver(tmp_path, rate_limit_delay="90s"), message(), fake, store)
    assert (result.retry, result.reason, result.delay) == (True, "rate_limited", 90.0)
    assert "Request Limit Exceeded" in result.detail


def test_retry_after_header_wins_over_the_default_delay() -> None:
    assert classify_response(httpx.Response(429, headers={"Retry-After": "7"}), rate_limit_delay=60).delay == 7.0
    assert classify_response(httpx.Response(429), rate_limit_delay=60).delay == 60


async def test_500_with_a_text_body_is_retried(tmp_path: Path, fake: FakePagerDuty, store: Store) -> None:
    fake.fail_next(1, "500")
    result = await deliver(receiver(tmp_path), message(), fake, store)
    assert (result.retry, result.reason) == (True, "http_500")
    assert "Internal Server Error" in result.detail


async def test_pagerduty_down_is_retried(tmp_path: Path, fake: FakePagerDuty, store: Store) -> None:
    await fake.go_down()
    result = await deliver(receiver(tmp_path), message(), fake, store)
    assert (result.retry, result.reason) == (True, "connection_refused")
    await fake.come_back()
    assert (await deliver(receiver(tmp_path), message(), fake, store)).delivered


async def test_no_answer_in_time_is_retried(tmp_path: Path, store: Store) -> None:
    def never_answers(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    sink = PagerDutySink(receiver(tmp_path), store, transport=httpx.MockTransport(never_answers))
    try:
        result = await sink.deliver(delivery(message()))
    finally:
        await sink.close()
    assert (result.retry, result.reason) == (True, "timeout")


async def test_a_receiver_nothing_answers_for_is_retried_and_said_in_words(tmp_path: Path, store: Store) -> None:
    sink = PagerDutySink(receiver(tmp_path, url=f"http://127.0.0.1:{free_port()}/v2/enqueue"), store)
    try:
        result = await sink.deliver(delivery(message()))
    finally:
        await sink.close()
    assert (result.retry, result.reason, result.detail) == (
        True,
        "connection_refused",
        "connection refused (nothing listens there)",
    )


async def test_a_wrong_url_is_not_retried(tmp_path: Path, fake: FakePagerDuty, store: Store) -> None:
    result = await deliver(receiver(tmp_path, url="https://events.pagerduty.com/v1/nope"), message(), fake, store)
    assert (result.retry, result.reason) == (False, "http_404")


# --- the fake answers like PagerDuty -------------------------------------------------------------------
def _trigger(**changes: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "routing_key": ROUTING_KEY,
        "event_action": "trigger",
        "dedup_key": "k1",
        "payload": {"summary": "s", "source": "h", "severity": "critical"},
    }
    event.update(changes)
    return event


@pytest.mark.parametrize(
    ("event", "error"),
    [
        (_trigger(routing_key="abc"), "Length of 'routing_key' is incorrect (should be 32 characters)"),
        (_trigger(event_action="page"), "'event_action' is invalid"),
        (_trigger(dedup_key="k" * 256), "'dedup_key'"),
        (_trigger(payload={"summary": "x" * 1025, "source": "h", "severity": "critical"}), "'payload.summary'"),
        (_trigger(payload={"summary": "s", "severity": "critical"}), "'payload.source'"),
        (_trigger(payload={"summary": "s", "source": "h", "severity": "fatal"}), "'payload.severity'"),
        ({"routing_key": ROUTING_KEY, "event_action": "resolve"}, "'dedup_key' is required"),
        (_trigger(payload={"summary": "s", "source": "h", "severity": "info", "x": "y" * 600_000}), "too large"),
    ],
)
async def test_fake_rejects_what_pagerduty_rejects(fake: FakePagerDuty, event: dict[str, Any], error: str) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(fake.url, json=event)
    assert response.status_code == 400
    body = response.json()
    assert (body["status"], body["message"]) == ("invalid event", "Event object is invalid")
    assert any(error in e for e in body["errors"])


async def test_fake_deduplicates_and_reopens_after_resolve(fake: FakePagerDuty) -> None:
    async with httpx.AsyncClient() as client:
        first = await client.post(fake.url, json=_trigger())
        await client.post(fake.url, json=_trigger())
        await client.post(fake.url, json={"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": "k1"})
        await client.post(fake.url, json={"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": "k9"})
        await client.post(fake.url, json=_trigger())
    assert first.status_code == 202
    assert first.json() == {"status": "success", "message": "Event processed", "dedup_key": "k1"}
    assert [e.outcome for e in fake.events] == ["accepted", "deduplicated", "accepted", "dropped", "accepted"]
    assert [a.status for a in fake.alerts["k1"]] == ["resolved", "triggered"]


# --- self-test alerts (gpu-alert-bot selftest) --------------------------------------------------------------
async def test_a_self_test_alert_pages_nobody_unless_the_run_asked_for_it(
    tmp_path: Path, fake: FakePagerDuty, store: Store
) -> None:
    config = receiver(tmp_path)
    quiet = message(labels={"alertname": "GPUSelfTest", "selftest": "abc123", "severity": "info"})
    assert (await deliver(config, quiet, fake, store)).delivered
    assert (await deliver(config, message("resolved", **{"labels": quiet.labels}), fake, store)).delivered
    assert fake.alerts == {}
    paged = message(labels={**quiet.labels, "selftest_pagerduty": "true"})
    assert (await deliver(config, paged, fake, store)).delivered
    assert fake.current(paged.alert_key).status == "triggered"

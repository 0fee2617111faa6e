"""Dedup: which alerts of a notification are news, and what the store remembers per alert episode."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.dedup import plan_events
from bot.models import AlertState, AmAlert, EventKind
from tests.support.clock import FakeClock
from tests.support.payloads import STARTED, am_alert, webhook
from tests.support.store import count, ingest, ingest_and_dedup, query, sqlite_store


def _am(**kwargs: object) -> AmAlert:
    return AmAlert.model_validate_json(json.dumps(am_alert(**kwargs)))  # type: ignore[arg-type]


NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _known(alert: AmAlert, status: str, last_heard: timedelta = timedelta(0)) -> AlertState:
    now = NOW - last_heard
    return AlertState(
        key=alert.key,
        fingerprint=alert.fingerprint,
        status=status,  # type: ignore[arg-type]
        labels=alert.labels,
        starts_at=alert.starts_at,
        first_seen=now,
        last_seen=now,
    )


class TestPlanEvents:
    def test_a_new_episode_fires(self) -> None:
        alert = _am(gpu="0")
        assert [d.event for d in plan_events({}, [alert], now=NOW)] == [EventKind.FIRING]

    def test_a_known_firing_alert_that_resolves_is_a_resolve_not_a_new_alert(self) -> None:
        firing, resolved = _am(gpu="0"), _am(gpu="0", status="resolved")
        assert firing.key == resolved.key
        assert [d.event for d in plan_events({firing.key: _known(firing, "firing")}, [resolved], now=NOW)] == [
            EventKind.RESOLVED
        ]

    def test_a_resolve_of_an_alert_never_seen_firing_is_still_told(self) -> None:
        assert [d.event for d in plan_events({}, [_am(status="resolved")], now=NOW)] == [EventKind.RESOLVED]

    def test_an_all_unchanged_notification_is_a_repeat_of_its_firing_alerts(self) -> None:
        a, b = _am(gpu="0"), _am(gpu="1", status="resolved")
        known = {a.key: _known(a, "firing"), b.key: _known(b, "resolved")}
        assert [d.event for d in plan_events(known, [a, b], now=NOW)] == [EventKind.REPEAT, None]

    def test_only_the_group_that_first_told_of_an_alert_repeats_it(self) -> None:
        alert = _am(gpu="0")
        known = {alert.key: _known(alert, "firing").model_copy(update={"group_key": "route-a"})}
        assert [d.event for d in plan_events(known, [alert], "route-a", now=NOW)] == [EventKind.REPEAT]
        assert [d.event for d in plan_events(known, [alert], "route-b", now=NOW)] == [None]

    def test_unchanged_alerts_ride_along_when_another_member_is_news(self) -> None:
        a, b = _am(gpu="0"), _am(gpu="1")
        assert [d.event for d in plan_events({a.key: _known(a, "firing")}, [a, b], now=NOW)] == [None, EventKind.FIRING]

    def test_a_late_firing_copy_never_reopens_a_resolved_episode(self) -> None:
        alert = _am(gpu="0")
        decisions = plan_events({alert.key: _known(alert, "resolved")}, [alert], now=NOW)
        assert [(d.event, d.stale) for d in decisions] == [(None, True)]

    def test_the_same_episode_firing_after_the_late_copy_window_fires_again(self) -> None:
        alert = _am(gpu="0")
        known = {alert.key: _known(alert, "resolved", last_heard=timedelta(seconds=61))}
        decisions = plan_events(known, [alert], late_copy_window=60.0, now=NOW)
        assert [(d.event, d.stale) for d in decisions] == [(EventKind.REFIRING, False)]

    def test_a_new_start_of_the_same_labels_is_a_new_episode(self) -> None:
        old = _am(gpu="0")
        new = _am(gpu="0", starts_at=STARTED + timedelta(hours=1))
        assert old.fingerprint == new.fingerprint and old.key != new.key
        assert [d.event for d in plan_events({old.key: _known(old, "resolved")}, [new], now=NOW)] == [EventKind.FIRING]


async def _events(store: object, key: str) -> list[str]:
    return [e.kind.value for e in await store.alert_events(key)]  # type: ignore[attr-defined]


async def test_per_episode_state_first_last_times_seen_status_resolved_at(tmp_path: Path) -> None:
    clock = FakeClock()
    async with sqlite_store(tmp_path, dedup_window=0.0, clock=clock) as store:
        firing = webhook([am_alert(gpu="0")])
        await ingest_and_dedup(store, firing)
        key = _am(gpu="0").key
        first = await store.get_alert(key)
        assert first is not None
        assert (first.status, first.times_seen, first.resolved_at) == ("firing", 1, None)
        assert first.first_seen == first.last_seen

        await clock.advance(1)
        await ingest_and_dedup(store, firing)  # outside the (zero) window: Alertmanager's repeat
        ends = STARTED + timedelta(minutes=7)
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved", ends_at=ends)]))
        last = await store.get_alert(key)
        assert last is not None
        assert last.status == "resolved"
        assert last.times_seen == 3
        assert last.first_seen == first.first_seen and last.last_seen > first.last_seen
        assert last.resolved_at == ends and last.ends_at == ends
        # One alert, updated in place: a repeat and a resolve of the same episode, never a second "firing".
        assert await _events(store, key) == ["firing", "repeat", "resolved"]
        assert count(store, "SELECT COUNT(*) FROM alerts") == 1


async def test_copies_within_the_window_create_no_work(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path, dedup_window=600.0) as store:
        payload = webhook([am_alert(gpu="0"), am_alert(gpu="1")], external_url="http://am-0:9093")
        assert not (await ingest(store, payload)).duplicate
        assert (await ingest(store, payload)).duplicate
        ha_copy = {**payload, "externalURL": "http://am-1:9093", "alerts": payload["alerts"][::-1]}
        assert (await ingest(store, ha_copy)).duplicate
        await store.dedup_pending(plan_events, 100)
        assert count(store, "SELECT COUNT(*) FROM notifications") == 1
        assert count(store, "SELECT COUNT(*) FROM events") == 2
        assert count(store, "SELECT duplicates FROM notification_keys") == 2


async def test_the_same_notification_after_the_window_is_a_repeat(tmp_path: Path) -> None:
    clock = FakeClock()
    async with sqlite_store(tmp_path, dedup_window=600, clock=clock) as store:
        payload = webhook([am_alert(gpu="0")])
        await ingest_and_dedup(store, payload)
        await clock.advance(600)
        assert (await ingest(store, payload)).duplicate
        await clock.advance(1)
        assert not (await ingest(store, payload)).duplicate
        await store.dedup_pending(plan_events, 100)
        assert await _events(store, _am(gpu="0").key) == ["firing", "repeat"]


async def test_a_member_joining_the_group_fires_only_the_new_member(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")]))
        await ingest_and_dedup(store, webhook([am_alert(gpu="0"), am_alert(gpu="1")]))
        assert await _events(store, _am(gpu="0").key) == ["firing"]
        assert await _events(store, _am(gpu="1").key) == ["firing"]
        carried = await store.get_alert(_am(gpu="0").key)
        assert carried is not None and carried.times_seen == 2


async def test_a_late_copy_from_a_slower_replica_does_not_reopen_a_resolved_alert(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")], external_url="http://am-0:9093"))
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved")], external_url="http://am-0:9093"))
        late = webhook([am_alert(gpu="0"), am_alert(gpu="1")], external_url="http://am-1:9093")
        await ingest_and_dedup(store, late)
        alert = await store.get_alert(_am(gpu="0").key)
        assert alert is not None and alert.status == "resolved" and alert.resolved_at is not None
        assert await _events(store, _am(gpu="0").key) == ["firing", "resolved"]


async def test_an_alert_firing_again_with_the_same_start_reopens_its_episode(tmp_path: Path) -> None:
    """Alertmanager resolved it (Prometheus could not reach it), then got it again with the same start."""
    planner = functools.partial(plan_events, late_copy_window=60)
    clock = FakeClock()
    async with sqlite_store(tmp_path, dedup_window=600.0, clock=clock) as store:
        firing = webhook([am_alert(gpu="0"), am_alert(gpu="1")])
        await ingest(store, firing)
        await ingest(store, webhook([am_alert(gpu="0", status="resolved"), am_alert(gpu="1")]))
        await store.dedup_pending(planner, 100)
        await clock.advance(61)
        # Identical to the first notification, within the dedup window, yet no copy: gpu 0 resolved since.
        assert not (await ingest(store, firing)).duplicate
        await store.dedup_pending(planner, 100)
        assert await _events(store, _am(gpu="0").key) == ["firing", "resolved", "refiring"]
        assert await _events(store, _am(gpu="1").key) == ["firing"]
        reopened = await store.get_alert(_am(gpu="0").key)
        assert reopened is not None and (reopened.status, reopened.resolved_at) == ("firing", None)
        assert (await ingest(store, firing)).duplicate  # and a copy of the re-fire is a copy again

        ends = STARTED + timedelta(hours=2)
        await ingest(store, webhook([am_alert(gpu="0", status="resolved", ends_at=ends), am_alert(gpu="1")]))
        await store.dedup_pending(planner, 100)
        resolved = await store.get_alert(_am(gpu="0").key)
        assert resolved is not None and (resolved.status, resolved.resolved_at) == ("resolved", ends)
        assert await _events(store, _am(gpu="0").key) == ["firing", "resolved", "refiring", "resolved"]


async def test_a_second_route_sending_the_same_alert_is_no_reminder(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")], group_key='{}/{severity=~"critical"}'))
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")], group_key='{}/{alertname=~"GPU.*"}'))
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved")], group_key="{}/{x}"))
        assert await _events(store, _am(gpu="0").key) == ["firing", "resolved"]


async def test_an_alert_repeated_inside_one_body_is_one_alert(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        alert = am_alert(gpu="0")
        await ingest_and_dedup(store, webhook([alert, {**alert, "annotations": {"summary": "second copy"}}]))
        state = await store.get_alert(_am(gpu="0").key)
        assert state is not None and state.annotations == {"summary": "second copy"}
        assert await _events(store, _am(gpu="0").key) == ["firing"]
        assert count(store, "SELECT COUNT(*) FROM notifications WHERE state = 'done'") == 1


async def test_a_notification_that_cannot_be_applied_is_set_aside_and_the_rest_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def planner(known: object, alerts: list[AmAlert], group_key: str, *, now: datetime) -> object:
        if any(a.labels.get("gpu") == "13" for a in alerts):
            raise RuntimeError("unlucky alert")
        return plan_events(known, alerts, group_key, now=now)  # type: ignore[arg-type]

    async with sqlite_store(tmp_path) as store:
        for gpu in ("1", "13", "2"):
            await ingest(store, webhook([am_alert(gpu=gpu)], group_key=f"g{gpu}"))
        assert await store.dedup_pending(planner, 100) == 3  # type: ignore[arg-type]
        assert await store.dedup_pending(planner, 100) == 0  # type: ignore[arg-type]
        assert await _events(store, _am(gpu="1").key) == ["firing"]
        assert await _events(store, _am(gpu="2").key) == ["firing"]
        assert await store.get_alert(_am(gpu="13").key) is None
        assert query_state(store) == {"done": 2, "failed": 1}
        assert (await store.stats()).notifications_failed == 1
    assert any("set aside" in r.getMessage() for r in caplog.records)


def query_state(store: object) -> dict[str, int]:
    return dict(query(store, "SELECT state, COUNT(*) FROM notifications GROUP BY state"))  # type: ignore[arg-type]

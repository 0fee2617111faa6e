"""The store contract, run on both backends through the Store interface only (the `opened` fixture): durable
ingest with copies caught, leases, event and outbox order, alert queries, GPU history, prune. Then what only
SQLite does: its pragmas, its health probe, its single-process lock and fsync."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.dedup import plan_events
from bot.models import (
    AmAlert,
    EventKind,
    EventRoute,
    GpuEvent,
    GpuHistoryRequest,
    NewDelivery,
    WebhookPayload,
    short_id,
)
from bot.storage.interface import StoreUnavailable, UnknownAlert, WatchdogRecord
from bot.store import core
from bot.store.sqlite import SqliteStore, StoreInUse
from tests.support.clock import FakeClock
from tests.support.payloads import STARTED, am_alert, distinct_webhooks, gpu_alerts, webhook
from tests.support.store import (
    Opener,
    allow_writes,
    count,
    incoming,
    ingest,
    ingest_and_dedup,
    message,
    refuse_writes,
    route_all,
    route_event,
    sqlite_store,
)


async def test_an_acknowledged_notification_survives_a_reopen(opened: Opener) -> None:
    async with opened() as store:
        result = await ingest(store, webhook(gpu_alerts(3)))
        assert result.accepted and not result.duplicate and result.notification_id == 1
    async with opened() as store:
        assert (await store.stats()).notifications_pending == 1
        assert await store.dedup_pending(plan_events, 10) == 1
        assert (await store.stats()).events_pending == 3


async def test_concurrent_ingests_share_commits_and_copies_in_one_batch_are_caught(opened: Opener) -> None:
    async with opened() as store:
        payloads = list(distinct_webhooks(200, 2))
        copies = [payloads[0]] * 5
        results = await asyncio.gather(*(store.ingest(incoming(p)) for p in payloads + copies))
        assert sum(not r.duplicate for r in results) == 200
        assert sum(r.duplicate for r in results) == 5
        ids = [r.notification_id for r in results if not r.duplicate]
        assert len(set(ids)) == 200
        assert (await store.stats()).notifications_pending == 200


async def test_dedup_reuses_the_payload_ingest_validated_and_parses_only_bodies_stored_by_another_process(
    opened: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[bytes] = []
    parse = core.read_notification

    def counted(body: bytes) -> tuple[WebhookPayload, list[AmAlert]]:
        parsed.append(body)
        return parse(body)

    monkeypatch.setattr(core, "read_notification", counted)
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2), group_key="before"))  # stored before any dedup ran
        assert len(parsed) == 1
        await ingest_and_dedup(store, webhook(gpu_alerts(2, host="here"), group_key="here"))
        assert len(parsed) == 1  # validated by ingest in this process, which dedups too: not parsed again
        await ingest(store, webhook(gpu_alerts(2, host="later"), group_key="later"))
    async with opened() as store:  # a restart: what the earlier process stored is read from its body
        assert await store.dedup_pending(plan_events, 10) == 1
        assert len(parsed) == 2
        assert (await store.stats()).events_pending == 6


async def test_events_are_leased_and_a_lease_expires(opened: Opener) -> None:
    clock = FakeClock()
    async with opened(clock=clock) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        first = await store.claim_events(10, lease_seconds=60)
        assert [e.attempts for e in first] == [1, 1]
        await clock.advance(59)
        assert await store.claim_events(10, lease_seconds=60) == []
        await clock.advance(1)
        again = await store.claim_events(10, lease_seconds=60)
        assert [e.id for e in again] == [e.id for e in first]
        assert [e.attempts for e in again] == [2, 2]


async def test_leases_of_a_dead_process_are_void_on_open(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        assert len(await store.claim_events(10, lease_seconds=3600)) == 2
    async with sqlite_store(tmp_path) as store:
        resumed = await store.claim_events(10, lease_seconds=60)
        assert len(resumed) == 2


async def test_routing_is_done_once_even_if_attempted_twice(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        [event] = await store.claim_events(10, 60)
        deliveries = [NewDelivery(receiver="console", message=message(event.alert.key))]
        await route_event(store, event.id, {"sections": []}, deliveries)
        await route_event(store, event.id, {"sections": [{"x": 1}]}, deliveries)
        assert (await store.stats()).deliveries_pending == 1
        assert (await store.alert_events(event.alert.key))[0].state == "routed"
        alert = await store.get_alert(event.alert.key)
        assert alert is not None and alert.enrichment == {"sections": []}


async def test_a_batchs_events_are_routed_together_each_once(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(3)))
        first, second, third = await store.claim_events(10, 60)
        routes = [
            EventRoute(first.id, {"sections": [{"n": 1}]}, [NewDelivery(receiver="console", message=message("a"))]),
            EventRoute(second.id, None, [NewDelivery(receiver=name, message=message("b")) for name in ("x", "y")]),
        ]
        await store.route_events(routes)
        await store.route_events(routes)  # again, as after a lease expiry: nothing doubled
        assert (await store.stats()).deliveries_pending == 3
        states = [(await store.alert_events(e.alert.key))[0].state for e in (first, second, third)]
        assert states == ["routed", "routed", "pending"]
        stored = await store.get_alert(first.alert.key)
        assert stored is not None and stored.enrichment == {"sections": [{"n": 1}]}
        await store.route_events([])


async def test_a_failed_event_is_retried_later_or_set_aside(opened: Opener) -> None:
    clock = FakeClock()
    async with opened(clock=clock) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        retry, give_up = await store.claim_events(10, 60)
        await store.fail_event(retry.id, "boom", retry_in=30)
        await store.fail_event(give_up.id, "boom for good", retry_in=None)
        await clock.advance(29)
        assert await store.claim_events(10, 60) == []
        await clock.advance(1)
        assert [e.id for e in await store.claim_events(10, 60)] == [retry.id]
        [record] = await store.alert_events(give_up.alert.key)
        assert (record.state, record.error) == ("failed", "boom for good")
        assert (await store.stats()).events_failed == 1


async def test_an_update_never_overtakes_the_pending_post_of_the_same_alert(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0"), am_alert(gpu="1")]))
        await route_all(store, ["slack"])
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved"), am_alert(gpu="1")]))
        await route_all(store, ["slack"])
        due = await store.due_deliveries("slack", 10)
        assert [d.message.event for d in due] == ["firing", "firing"]  # the resolve of gpu 0 waits
        post_gpu0 = due[0]
        await store.delivery_retry(post_gpu0.id, "http_503: down", datetime.now(UTC) + timedelta(hours=1))
        await store.delivery_succeeded(due[1].id)
        assert await store.due_deliveries("slack", 10) == []  # still behind the retried post
        assert await store.next_delivery_due("slack") is not None
        await store.delivery_failed(post_gpu0.id, "channel_not_found")
        [resolve] = await store.due_deliveries("slack", 10)
        assert resolve.message.event == "resolved" and resolve.alert_key == post_gpu0.alert_key
        assert (await store.stats()).deliveries_failed == 1
        assert await store.due_deliveries("email", 10) == []


async def test_an_event_waits_while_an_earlier_event_of_the_same_alert_is_pending(opened: Opener) -> None:
    clock = FakeClock()
    async with opened(clock=clock) as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0"), am_alert(gpu="1")]))
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved"), am_alert(gpu="1")]))
        firing_gpu0, firing_gpu1 = await store.claim_events(10, 60)
        await store.fail_event(firing_gpu0.id, "database is locked", retry_in=30)
        await route_event(store, firing_gpu1.id, None, [])
        assert await store.claim_events(10, 60) == []  # the resolve of gpu 0 waits for its firing
        await clock.advance(30)
        [retried] = await store.claim_events(10, 60)
        assert retried.id == firing_gpu0.id
        await route_event(store, retried.id, None, [])
        [resolve] = await store.claim_events(10, 60)
        assert resolve.kind == EventKind.RESOLVED and resolve.alert.key == firing_gpu0.alert.key


async def test_the_next_due_delivery_is_one_that_may_go(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook([am_alert(gpu="0")]))
        await route_all(store, ["slack"])
        await ingest_and_dedup(store, webhook([am_alert(gpu="0", status="resolved")]))
        await route_all(store, ["slack"])
        [post] = await store.due_deliveries("slack", 10)
        retry_at = (datetime.now(UTC) + timedelta(minutes=5)).replace(microsecond=0)
        await store.delivery_retry(post.id, "http_503: down", retry_at)
        # The resolve was due at once, but it waits behind the post: waking for it would only spin.
        assert await store.next_delivery_due("slack") == retry_at


async def test_sink_state_is_kept_per_receiver_and_key(opened: Opener) -> None:
    async with opened() as store:
        assert await store.get_sink_state("slack", "a") is None
        await store.put_sink_state("slack", "a", {"ts": "1.2"})
        await store.put_sink_state("slack", "a", {"ts": "3.4"})
        await store.put_sink_state("email", "a", {"id": "<x@y>"})
        assert await store.get_sink_state("slack", "a") == {"ts": "3.4"}
        assert await store.get_sink_state("email", "a") == {"id": "<x@y>"}


async def test_alert_queries(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook([am_alert("GPUXidError", gpu="0"), am_alert("GPUHot", gpu="1")]))
        await ingest_and_dedup(store, webhook([am_alert("GPUHot", gpu="1", status="resolved")], group_key="h"))
        assert {a.alertname for a in await store.list_alerts()} == {"GPUXidError", "GPUHot"}
        assert [a.alertname for a in await store.list_alerts("resolved")] == ["GPUHot"]
        recent = await store.recent_alerts(["GPUHot"], datetime.now(UTC) - timedelta(minutes=1))
        assert [a.alertname for a in recent] == ["GPUHot"]
        assert await store.recent_alerts([], datetime.now(UTC)) == []
        stats = await store.stats()
        assert (stats.alerts_firing, stats.alerts_resolved) == (1, 1)


async def test_a_silence_is_kept_on_its_alert_with_a_note_until_forgotten(opened: Opener) -> None:
    until = datetime(2026, 11, 30, 14, tzinfo=UTC)
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        [alert, other] = sorted(await store.list_alerts(), key=lambda a: a.key)
        note = await store.set_silence(alert.key, "9f2c-silence", "slack:U1 alice", until, "silenced for 2h")
        assert [e.id for e in await store.alert_events(alert.key)][-1] == note
        [silenced] = await store.silenced_alerts()
        assert (silenced.key, silenced.silence_id, silenced.silenced_by) == (
            alert.key,
            "9f2c-silence",
            "slack:U1 alice",
        )
        assert silenced.silenced_until == until
        with pytest.raises(UnknownAlert):
            await store.set_silence("nope@2026-11-29T13:31:59+00:00", "x", "y", until, "z")
    async with opened() as store:
        assert [a.key for a in await store.silenced_alerts()] == [alert.key]
        await store.set_silence(alert.key, None, None, None, "the silence expired")
        assert await store.silenced_alerts() == []
        kinds = [e.kind for e in await store.alert_events(alert.key)]
        assert kinds == [EventKind.FIRING, EventKind.NOTE, EventKind.NOTE]
        assert [e.kind for e in await store.alert_events(other.key)] == [EventKind.FIRING]


async def test_one_request_at_a_time_takes_an_alerts_silence_slot(opened: Opener) -> None:
    at = datetime(2026, 11, 30, 12, tzinfo=UTC)
    stale = at - timedelta(minutes=2)
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        [alert] = await store.list_alerts()
        taken = await asyncio.gather(*(store.claim_silence(alert.key, f"u{n}", at, stale) for n in range(5)))
        assert sorted(taken) == [False, False, False, False, True]
        holder = await store.get_alert(alert.key)
        assert holder is not None and holder.silenced_by == f"u{taken.index(True)}" and holder.silence_id is None
        await store.release_silence(alert.key, at)
        assert await store.claim_silence(alert.key, "alice", at, stale)
        await store.set_silence(alert.key, "9f2c-silence", "alice", at + timedelta(hours=1), "silenced")
        later = at + timedelta(hours=3)  # a set silence is never stale: it is forgotten when it ends
        assert not await store.claim_silence(alert.key, "bob", later, later)
        await store.release_silence(alert.key, at)  # the slot is the silence's now: nothing to give back
        assert (await store.get_alert(alert.key)).silence_id == "9f2c-silence"  # type: ignore[union-attr]
        await store.set_silence(alert.key, None, None, None, "expired")
        # A slot whose taker died before it set a silence is taken again once older than `stale_before`.
        assert await store.claim_silence(alert.key, "carol", at, stale)
        assert not await store.claim_silence(alert.key, "dave", at + timedelta(minutes=1), stale)
        assert await store.claim_silence(alert.key, "dave", at + timedelta(minutes=3), at + timedelta(minutes=1))
        with pytest.raises(UnknownAlert):
            await store.claim_silence("nope@2026-11-29T13:31:59+00:00", "x", at, stale)


async def test_an_alerts_deliveries_are_listed_with_their_event_oldest_first(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        await route_all(store, ["console", "slack"])
        [alert] = await store.list_alerts()
        first, second = await store.due_deliveries("console", 10) + await store.due_deliveries("slack", 10)
        await store.delivery_succeeded(first.id)
        await store.delivery_failed(second.id, "channel_not_found")
        records = await store.alert_deliveries(alert.key)
        assert [(r.event_kind, r.receiver, r.state, r.attempts, r.error) for r in records] == [
            (EventKind.FIRING, "console", "delivered", 1, None),
            (EventKind.FIRING, "slack", "failed", 1, "channel_not_found"),
        ]
        assert await store.alert_deliveries("nope@2026-11-29T13:31:59+00:00") == []


async def test_the_watchdog_timers_move_forward_shift_and_alert(opened: Opener) -> None:
    start = datetime(2026, 11, 30, 12, tzinfo=UTC)
    async with opened() as store:
        await store.watchdog_start("any", start)
        await store.watchdog_start("any", start + timedelta(hours=1))  # a restart keeps the running timer
        await store.watchdog_seen(["any", "http://am-0:9093"], start + timedelta(minutes=2))
        await store.watchdog_seen(["any"], start + timedelta(minutes=1))  # late: the timer never goes back
        await store.watchdog_alerting("http://am-0:9093", start + timedelta(minutes=2))
        await store.watchdog_shift(30)  # an alerting timer stays where it was
    async with opened() as store:
        assert await store.watchdog_records() == [
            WatchdogRecord("any", start + timedelta(minutes=2, seconds=30)),
            WatchdogRecord("http://am-0:9093", start + timedelta(minutes=2), start + timedelta(minutes=2)),
        ]
        await store.watchdog_alerting("http://am-0:9093", None)
        assert [r.alerted_since for r in await store.watchdog_records()] == [None, None]


async def test_gpu_events_are_recorded_once(opened: Opener) -> None:
    event = GpuEvent(gpu_key="k-ai-01/GPU-1", host="k-ai-01", kind="xid", code="79", at=STARTED)
    async with opened() as store:
        await store.record_gpu_events([event, event])
        await store.record_gpu_events([event])
        assert await store.gpu_events(STARTED - timedelta(days=1)) == [event]
        assert await store.gpu_events(STARTED - timedelta(days=1), kind="alert") == []


async def test_gpu_events_recorded_and_read_in_one_call_are_those_of_the_keys_asked_for(opened: Opener) -> None:
    def xid(key: str, minutes: int) -> GpuEvent:
        return GpuEvent(gpu_key=key, host="k-ai-01", kind="xid", code="79", at=STARTED + timedelta(minutes=minutes))

    async with opened() as store:
        await store.record_gpu_events([xid("GPU-a", 1), xid("k-ai-01/0", -5), xid("k-ai-01/1", 2)])
        read = await store.record_and_read_gpu_events([xid("k-ai-01/0", 3)], STARTED, ["GPU-a", "k-ai-01/0"])
        assert read == [xid("GPU-a", 1), xid("k-ai-01/0", 3)]  # oldest first, the new one included, none too old
        assert await store.record_and_read_gpu_events([], STARTED, []) == []
        assert len(await store.gpu_events(STARTED - timedelta(days=1))) == 4


async def test_a_batchs_gpu_histories_are_recorded_and_read_in_turn_in_one_call(opened: Opener) -> None:
    def xid(code: str, minutes: int) -> GpuEvent:
        return GpuEvent(gpu_key="GPU-a", host="k-ai-01", kind="xid", code=code, at=STARTED + timedelta(minutes=minutes))

    async with opened() as store:
        first, second, other = await store.record_and_read_gpu_histories(
            [
                GpuHistoryRequest([xid("79", 1)], STARTED, ["GPU-a"]),
                GpuHistoryRequest([xid("48", 2), xid("79", 1)], STARTED, ["GPU-a"]),
                GpuHistoryRequest([], STARTED, ["GPU-b"]),
            ]
        )
        # Each as if alone, in order: the first does not see what the second records; nothing is doubled.
        assert first == [xid("79", 1)]
        assert second == [xid("79", 1), xid("48", 2)]
        assert other == []
        assert await store.record_and_read_gpu_histories([]) == []


async def test_prune_keeps_pending_work_and_forgets_expired_dedup_keys(opened: Opener) -> None:
    clock = FakeClock()
    async with opened(dedup_window=600, clock=clock) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1), group_key="done"))
        await route_all(store, ["console"])
        await ingest(store, webhook(gpu_alerts(1, host="pending"), group_key="pending"))
        await clock.advance(599)
        assert await store.prune(clock.now() - timedelta(days=1)) == 0  # within the window: every key still counts
        await clock.advance(2)
        removed = await store.prune(clock.now())
        assert removed == 5  # the done notification, its routed event, its alert and both expired keys
        stats = await store.stats()
        assert (stats.notifications_pending, stats.deliveries_pending) == (1, 1)
        assert not (await ingest(store, webhook(gpu_alerts(1), group_key="done"))).duplicate  # its key expired


async def test_prune_forgets_resolved_alerts_and_old_gpu_history_but_keeps_live_firing_alerts(opened: Opener) -> None:
    async with opened() as store:
        resolved = am_alert(host="gone", status="resolved", ends_at=STARTED + timedelta(minutes=5))
        await ingest_and_dedup(store, webhook([resolved], group_key="resolved"))
        await ingest_and_dedup(store, webhook(gpu_alerts(1, host="still-firing"), group_key="firing"))
        await route_all(store, ["console"])
        await store.record_gpu_events(
            [GpuEvent(gpu_key="GPU-1", kind="xid", code="79", at=datetime.now(UTC) - timedelta(days=40))]
        )
        await store.prune(datetime.now(UTC) - timedelta(days=30))
        assert await store.gpu_events(datetime.now(UTC) - timedelta(days=400)) == []
        assert len(await store.list_alerts()) == 2  # resolved within retention: kept
        await store.prune(datetime.now(UTC) - timedelta(minutes=1))
        assert [a.status for a in await store.list_alerts()] == ["firing"]  # heard of within retention


async def test_prune_forgets_a_firing_alert_whose_resolve_never_came(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1, host="resolve-lost"), group_key="lost"))
        await route_all(store, ["console"])
        await ingest_and_dedup(store, webhook(gpu_alerts(1, host="not-routed-yet"), group_key="pending"))
        await store.prune(datetime.now(UTC) + timedelta(seconds=1))  # nothing heard of either within retention
        assert [a.labels["host"] for a in await store.list_alerts()] == ["not-routed-yet"]
        assert (await store.stats()).alerts_firing == 1


async def test_alerts_are_found_by_short_id_and_notes_are_events_of_their_alert(opened: Opener) -> None:
    async with opened() as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(2)))
        [firing, _] = await store.claim_events(10, 60)
        found = await store.alert_by_short_id(f" {short_id(firing.alert.key).upper()} ")
        assert found is not None and found.key == firing.alert.key
        assert await store.alert_by_short_id("zzzzzzz") is None
        await route_event(store, firing.id, None, [])
        note_id = await store.add_note(firing.alert.key, "restarted dcgm-exporter")
        [noted] = await store.claim_events(10, 60)
        assert (noted.id, noted.kind, noted.note) == (note_id, EventKind.NOTE, "restarted dcgm-exporter")
        with pytest.raises(UnknownAlert):
            await store.add_note("nope@2026-11-29T13:31:59+00:00", "x")
        await route_event(store, noted.id, None, [])
        await store.prune(datetime.now(UTC) + timedelta(days=1))
        assert await store.alert_by_short_id(short_id(firing.alert.key)) is None


@pytest.mark.parametrize(
    ("pragma", "reason"),
    [("query_only = 1", "readonly"), ("max_page_count = {pages}", "full")],
    ids=["read-only", "disk-full"],
)
async def test_a_store_that_refuses_writes_is_unavailable_then_recovers(
    tmp_path: Path, pragma: str, reason: str
) -> None:
    async with sqlite_store(tmp_path) as store:
        await store.check_writable()
        await refuse_writes(store, pragma)
        with pytest.raises(StoreUnavailable, match=reason):
            await store.check_writable()
        big = webhook(gpu_alerts(100, annotations={"description": "z" * 500}))
        with pytest.raises(StoreUnavailable, match=reason):
            await ingest(store, big)
        await allow_writes(store, "query_only = 0" if "query_only" in pragma else "max_page_count = 1073741823")
        await store.check_writable()
        assert not (await ingest(store, big)).duplicate
        assert (await store.stats()).notifications_pending == 1


async def test_only_one_process_may_open_a_store_but_readers_may(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        second = SqliteStore(tmp_path / "bot.db")
        with pytest.raises(StoreInUse, match="in use by another gpu-alert-bot process"):
            await second.open()
        await second.close()
        async with sqlite_store(tmp_path, read_only=True) as reader:
            assert len(await reader.list_alerts()) == 1
    async with sqlite_store(tmp_path) as reopened:
        assert len(await reopened.list_alerts()) == 1


async def test_the_group_commit_survives_an_unexpected_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with sqlite_store(tmp_path) as store:
        original = store._ingest_batch
        calls: list[Any] = []

        def flaky(conn: Any, batch: Any, resolved: Any) -> Any:
            calls.append(batch)
            if len(calls) == 1:
                # A write that must be rolled back.
                conn.execute("INSERT INTO notification_keys (key, accepted_at, last_received_at) VALUES ('k', 0, 0)")
                raise RuntimeError("bug")
            return original(conn, batch, resolved)

        monkeypatch.setattr(store, "_ingest_batch", flaky)
        with pytest.raises(StoreUnavailable, match="bug"):
            await ingest(store, webhook(gpu_alerts(1)))
        assert count(store, "SELECT COUNT(*) FROM notification_keys") == 0
        assert not (await ingest(store, webhook(gpu_alerts(1)))).duplicate  # not half-written, and still running


async def test_ingest_after_close_is_unavailable(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "bot.db")
    await store.open()
    await store.close()
    with pytest.raises(StoreUnavailable):
        await ingest(store, webhook(gpu_alerts(1)))


async def test_read_only_open_of_a_missing_store_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="no store"):
        async with sqlite_store(tmp_path, read_only=True):
            pass


async def test_an_acknowledged_ingest_commits_with_a_full_fsync(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path) as store:
        statements: list[str] = []
        store._writable_inbox.set_trace_callback(statements.append)  # the webhooks' file
        await ingest(store, webhook(gpu_alerts(1)))
        store._writable_inbox.set_trace_callback(None)
        commit = statements.index("COMMIT")
        assert "PRAGMA synchronous=FULL" in statements[:commit]
        assert statements[commit + 1 :][:1] == ["PRAGMA synchronous=NORMAL"]

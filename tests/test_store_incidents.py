"""The store's part of incidents, on both backends (the `opened` fixture): which alerts open an incident, which join
it, which were told alone before it; its versions and resolution; and the incident lane of the outbox (the newest
version stands for the older ones, a hold makes newer versions wait as long)."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.incident.membership import IncidentArrival, IncidentRule, MemberPolicy
from bot.incident.model import incident_key
from bot.incident.record import IncidentAdvance
from bot.incident.stage import incident_message
from bot.incident.view import build_view
from bot.models import Event, EventRoute, IncidentRoute, NewDelivery
from bot.storage.interface import Store
from tests.support.clock import FakeClock
from tests.support.payloads import gpu_alerts, webhook
from tests.support.store import Opener, ingest_and_dedup, message, postgres_store, sqlite_store

RULE = IncidentRule(threshold=5, window=60.0)


def arrivals(events: list[Event]) -> list[IncidentArrival]:
    return [
        IncidentArrival(
            e.alert.key,
            e.alert.labels["alertname"],
            e.alert.labels.get("host", ""),
            MemberPolicy("gpu-xid", gathers=frozenset({e.alert.labels["alertname"]})),
            new=e.kind.value == "firing",
        )
        for e in events
    ]


async def storm(store: Store, host: str, count: int) -> list[Event]:
    await ingest_and_dedup(store, webhook(gpu_alerts(count, host=host), group_key=f'{{}}:{{host="{host}"}}'))
    return await store.claim_events(1000, 60)


async def test_more_new_alerts_of_one_name_than_the_threshold_open_one_incident(opened: Opener) -> None:
    async with opened() as store:
        few = await storm(store, "k-ai-01", 5)
        assert await store.attribute_incidents(arrivals(few), RULE) == {}  # 5 is not more than 5
        await store.route_events([EventRoute(e.id, None, []) for e in few])  # told on their own
        more = await storm(store, "k-ai-02", 3)
        found = await store.attribute_incidents(arrivals(more), RULE)
        [incident_id] = {m.incident_id for m in found.values()}
        assert len(found) == 3 and all(m.opened and not m.alone for m in found.values())
        record = await store.get_incident(incident_id)
        assert record is not None and record.state == "open" and record.version == 0
        # The five told before it opened are members too, and keep their own messages.
        assert (record.summary.alerts, record.summary.alone) == (8, 5)
        assert await store.alert_incident(few[0].alert.key) == incident_id
        # Later alerts of that name join it; asked again, an arrival keeps its membership.
        later = await storm(store, "k-ai-03", 1)
        joined = await store.attribute_incidents(arrivals(later), RULE)
        assert [(m.incident_id, m.alone, m.opened) for m in joined.values()] == [(incident_id, False, False)]
        again = await store.attribute_incidents(arrivals(later), RULE)
        assert again == joined


async def test_an_incident_resolves_when_all_its_alerts_have(opened: Opener) -> None:
    async with opened() as store:
        events = await storm(store, "k-ai-01", 6)
        [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        [record] = await store.advance_incidents({incident_id: IncidentAdvance({"traits": []})})
        assert (record.version, record.state, record.analysis) == (1, "open", {"traits": []})
        await store.route_events([EventRoute(e.id, None, []) for e in events])
        resolved = [{**a, "status": "resolved"} for a in gpu_alerts(6, host="k-ai-01")]
        await ingest_and_dedup(store, webhook(resolved, group_key='{}:{host="k-ai-01"}'))
        [record] = await store.advance_incidents({incident_id: IncidentAdvance()})
        assert (record.version, record.state, record.analysis) == (2, "resolved", {"traits": []})
        assert record.resolved_at is not None and record.summary.firing == 0
        assert {line.status for line in await store.incident_alerts(incident_id)} == {"resolved"}


async def test_an_incidents_newest_pending_version_stands_for_the_older_ones(opened: Opener) -> None:
    async with opened() as store:
        events = await storm(store, "k-ai-01", 6)
        [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        key = incident_key(incident_id)
        for _ in range(3):
            [record] = await store.advance_incidents({incident_id: IncidentAdvance()})
            deliveries = [NewDelivery(receiver="slack", message=incident_message(record))]
            await store.route_events([], [IncidentRoute(key, deliveries)])
        # An alert outside the incident goes in the other lane, whatever waits in this one.
        await ingest_and_dedup(store, webhook(gpu_alerts(1, host="k-ai-09", alertname="GPUFellOffTheBus")))
        [alone] = await store.claim_events(10, 60)
        await store.route_events(
            [EventRoute(alone.id, None, [NewDelivery(receiver="slack", message=message(alone.alert.key))])]
        )
        [alert_delivery] = await store.due_deliveries("slack", 10)
        assert alert_delivery.alert_key == alone.alert.key
        [newest] = await store.due_deliveries("slack", 10, "incidents")
        assert newest.message.incident is not None and newest.message.incident.version == 3
        assert await store.supersede_deliveries(newest) == 2
        # The sink holds it (a digest's interval): no attempt counted, and a newer version waits as long.
        until = (datetime.now(UTC) + timedelta(minutes=5)).replace(microsecond=0)
        await store.delivery_held(newest, until, "held")
        assert await store.due_deliveries("slack", 10, "incidents") == []
        [record] = await store.advance_incidents({incident_id: IncidentAdvance()})
        await store.route_events(
            [], [IncidentRoute(key, [NewDelivery(receiver="slack", message=incident_message(record))])]
        )
        assert await store.due_deliveries("slack", 10, "incidents") == []
        assert await store.next_delivery_due("slack", "incidents") == until


async def test_two_replicas_attributing_two_halves_of_a_storm_at_once_agree_on_one_incident(postgres_dsn: str) -> None:
    async with postgres_store(postgres_dsn) as first, postgres_store(postgres_dsn) as second:
        for host in ("k-ai-01", "k-ai-02"):
            await ingest_and_dedup(first, webhook(gpu_alerts(4, host=host), group_key=f'{{}}:{{host="{host}"}}'))
        events = await first.claim_events(100, 60)
        halves = [[e for e in events if e.alert.labels["host"] == host] for host in ("k-ai-01", "k-ai-02")]
        found = await asyncio.gather(
            first.attribute_incidents(arrivals(halves[0]), RULE), second.attribute_incidents(arrivals(halves[1]), RULE)
        )
    memberships = {**found[0], **found[1]}
    assert len(memberships) == 8 and len({m.incident_id for m in memberships.values()}) == 1
    assert sum(m.opened for m in memberships.values()) == 4  # one replica opened it, the other found it open


async def test_an_incidents_members_come_back_with_their_workload_alone_of_their_evidence(opened: Opener) -> None:
    """A version folds every member in as it reads it: with only the workload of their evidence (who is hurt), not
    all of it, so that an incident of thousands of alerts does not hold every alert's evidence at each version."""
    async with opened() as store:
        events = await storm(store, "k-ai-01", 6)
        [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        job = {"jobs": [{"id": "4121", "user": "alice"}], "likely_lost": True}
        workload = {"name": "workload", "title": "Workload", "status": "ok", "data": job}
        xid = {"name": "xid", "title": "Kernel Xid", "status": "ok", "lines": ["NVRM: Xid 79"] * 50}
        evidence = {"sections": [xid, workload]}
        await store.route_events([EventRoute(e.id, evidence if e is events[0] else None, []) for e in events])
        record = await store.get_incident(incident_id)
        assert record is not None
        assert list(record.summary.workloads) == [events[0].alert.key]  # the others found none
        assert record.summary.workloads[events[0].alert.key].model_dump(exclude_defaults=True) == job
        assert build_view(record).work == "1 Slurm job of 1 user (1 likely lost)"
        # The firing alerts an incident's analysis reads (for other alerts on its hosts) come without evidence.
        light = {a.key: a.enrichment for a in await store.list_alerts("firing", 100, evidence=False)}
        whole = {a.key: a.enrichment for a in await store.list_alerts("firing", 100)}
        assert light == dict.fromkeys(whole) and whole[events[0].alert.key] == evidence


async def test_an_incidents_origins_are_its_alerts_distinct_site_labels_and_generator_urls(opened: Opener) -> None:
    async with opened() as store:
        events = await storm(store, "k-ai-01", 6) + await storm(store, "k-ai-02", 2)
        [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        origins = await store.incident_origins(incident_id, ["host", "site"])  # no alert has a `site` label
        generator = events[0].alert.generator_url
        assert sorted(origins, key=str) == [({"host": "k-ai-01"}, generator), ({"host": "k-ai-02"}, generator)]
        assert await store.incident_origins(incident_id, []) == [({}, generator)]


async def opened_incident(store: Store, alertname: str, host: str) -> str:
    """The incident a storm of 6 `alertname` alerts on `host` opens, at its first version."""
    await ingest_and_dedup(store, webhook(gpu_alerts(6, host=host, alertname=alertname), group_key=host))
    events = await store.claim_events(100, 60)
    [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
    await store.advance_incidents({incident_id: IncidentAdvance({})})
    await store.route_events([EventRoute(e.id, None, []) for e in events])
    return incident_id


async def resolve_all(store: Store, alertname: str, host: str, incident_id: str) -> None:
    resolved = [{**a, "status": "resolved"} for a in gpu_alerts(6, host=host, alertname=alertname)]
    await ingest_and_dedup(store, webhook(resolved, group_key=host))
    await store.route_events([EventRoute(e.id, None, []) for e in await store.claim_events(100, 60)])
    [record] = await store.advance_incidents({incident_id: IncidentAdvance()})
    assert record.state == "resolved"


async def test_incidents_are_listed_open_first_then_the_most_recent(opened: Opener) -> None:
    """What `gpu-alert-bot incidents` reads: the open ones before any resolved one, newest first."""
    clock = FakeClock(datetime.now(UTC))
    async with opened(clock=clock) as store:
        first = await opened_incident(store, "GPUTempCritical", "k-ai-01")
        await resolve_all(store, "GPUTempCritical", "k-ai-01", first)
        await clock.advance(120)
        still_open = await opened_incident(store, "GPUFellOffTheBus", "k-ai-02")
        await clock.advance(120)
        latest = await opened_incident(store, "GPUMemoryTempHigh", "k-ai-03")
        await resolve_all(store, "GPUMemoryTempHigh", "k-ai-03", latest)
        listed = [await store.get_incident(head.id) for head in await store.incident_heads(10)]
        assert [r.id for r in listed if r] == [still_open, latest, first]
        assert [r.state for r in listed if r] == ["open", "resolved", "resolved"]
        top = listed[0]
        assert top is not None
        assert (top.alertname, list(top.summary.hosts), top.summary.alerts) == ("GPUFellOffTheBus", ["k-ai-02"], 6)
        assert [head.id for head in await store.incident_heads(2)] == [still_open, latest]


async def named_storm(store: Store, alertname: str, hosts: list[str], per_host: int) -> list[Event]:
    for host in hosts:
        alerts = gpu_alerts(per_host, host=host, alertname=alertname)
        await ingest_and_dedup(store, webhook(alerts, group_key=f'{{}}:{{alertname="{alertname}", host="{host}"}}'))
    return await store.claim_events(1000, 60)


async def test_alerts_of_another_name_on_its_hosts_join_it_and_those_on_other_hosts_do_not(opened: Opener) -> None:
    """The membership rule as each backend reads and writes it (bot/incident/membership.py): the hosts of an open
    incident are found by the arrivals' hosts, its gathered alertnames kept with it."""
    rule = IncidentRule(threshold=5, window=60.0, host_window=900.0)
    async with opened() as store:
        inlet = await named_storm(store, "InletTemperatureHigh", ["c-01", "c-02", "c-03"], 2)
        [cooling] = {m.incident_id for m in (await store.attribute_incidents(arrivals(inlet), rule)).values()}
        await store.route_events([EventRoute(e.id, None, []) for e in inlet])
        hot = await named_storm(store, "GPUTempCritical", ["c-02"], 4)
        xid = await named_storm(store, "GPUXIDError", ["d-01", "d-02"], 1)
        found = await store.attribute_incidents(arrivals(hot + xid), rule)
        assert {(m.incident_id, m.via) for k, m in found.items()} == {(cooling, "host")}
        assert set(found) == {e.alert.key for e in hot}  # the two Xid alerts on other hosts stay alone
        # Its gathered alertnames are kept: a GPUTempCritical on a new host joins it while it grows.
        spread = await named_storm(store, "GPUTempCritical", ["c-09"], 1)
        joined = await store.attribute_incidents(arrivals(spread), rule)
        assert [(m.incident_id, m.via) for m in joined.values()] == [(cooling, "alertname")]
        [record] = await store.advance_incidents({cooling: IncidentAdvance()})
        assert sorted(record.summary.names) == ["GPUTempCritical", "InletTemperatureHigh"]
        assert sorted(record.summary.hosts) == ["c-01", "c-02", "c-03", "c-09"]
        assert await store.incidents_to_settle(0.0) == [cooling]  # hosts joined since its (no) analysis


async def test_an_older_stores_open_incident_gathers_its_own_alertname_and_keeps_its_receivers(tmp_path: Path) -> None:
    """A store written before incidents gathered alerts on their hosts: opened again, its open incident goes on
    taking its alertname's alerts, and its versions go to the receivers that had them."""
    path = tmp_path / "bot.db"
    async with sqlite_store(path) as store:
        events = await storm(store, "k-ai-01", 6)
        [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        [record] = await store.advance_incidents({incident_id: IncidentAdvance(receivers=frozenset({"slack"}))})
        version = [NewDelivery(receiver="slack", message=incident_message(record))]
        await store.route_events([EventRoute(e.id, None, []) for e in events])
        await store.route_events([], [IncidentRoute(incident_key(incident_id), version)])
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("DROP INDEX incident_members_host")
        for table, column in [("incident_members", "host"), *(("incidents", c) for c in OLDER_INCIDENT_COLUMNS)]:
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 4")
    async with sqlite_store(path) as store:
        later = await storm(store, "k-ai-02", 1)
        joined = await store.attribute_incidents(arrivals(later), RULE)
        assert [(m.incident_id, m.via) for m in joined.values()] == [(incident_id, "alertname")]
        [record] = await store.advance_incidents({incident_id: IncidentAdvance()})
    assert record.receivers == ("slack",)


OLDER_INCIDENT_COLUMNS = ("gathers", "apart", "grew_at", "analysed_at", "receivers")

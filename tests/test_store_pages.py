"""What the incident pages read, on both backends (the `opened` fixture): one page of an incident's alerts, filtered
and sorted by the store (host and value derived from labels and annotations as the rest of the bot does), and the
list of incidents, the open ones first."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bot.incident.members import alert_value
from bot.incident.record import IncidentAdvance
from bot.models import host_from_labels
from bot.storage.interface import Store
from bot.storage.pages import AlertQuery
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.store import Opener, ingest_and_dedup
from tests.test_store_incidents import RULE, arrivals

# Hosts named three ways (a host label, an instance with its port, an IPv6 instance), values stated three ways (a
# `value` annotation, the last "(N unit)" of the summary, none).
ROWS = [
    ({"instance": "k-ai-010:9400", "gpu": "10", "row": "C"}, {"summary": "hot (91 °C) then (96 °C)"}),
    ({"instance": "k-ai-002:9400", "gpu": "2", "row": "C"}, {"value": "93.5", "summary": "GPU hot"}),
    ({"host": "k-ai-003", "instance": "x:1", "gpu": "9", "row": "D"}, {"summary": "GPU hot (88 °C)"}),
    ({"instance": "[::1]:9400", "gpu": "0", "row": "C"}, {"summary": "no number here"}),
    ({"instance": "k-db-001:9400", "gpu": "1", "row": "D"}, {"value": " 120 ", "summary": "(5 °C)"}),
    ({"instance": "K-AI-099:9400", "gpu": "3", "row": "C"}, {"value": "warm", "summary": "then (97.25 W)"}),
]


async def incident_of(store: Store) -> str:
    alerts = [
        am_alert("GPUTempCritical", annotations=notes, **labels, starts_at=datetime(2026, 11, 29, 13, n, tzinfo=UTC))
        for n, (labels, notes) in enumerate(ROWS)
    ]
    await ingest_and_dedup(store, webhook(alerts, group_key='{}:{alertname="GPUTempCritical"}'))
    events = await store.claim_events(100, 60)
    [incident_id] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
    return incident_id


def hosts(page: list) -> list[str]:  # type: ignore[type-arg]
    return [host_from_labels(a.labels) for a in page]


async def test_an_incidents_alerts_are_sorted_by_the_store_as_the_bot_reads_hosts_and_values(opened: Opener) -> None:
    async with opened() as store:
        incident_id = await incident_of(store)
        by_value = await store.incident_alert_page(incident_id, AlertQuery(sort="value", descending=True))
        values = [alert_value(a.annotations)[0] for a in by_value.alerts]
        # The summary's last number, a `value` annotation (blanks around it too), and none last.
        assert values == [120.0, 97.25, 96.0, 93.5, 88.0, None]
        ascending = await store.incident_alert_page(incident_id, AlertQuery(sort="value", descending=False))
        assert [alert_value(a.annotations)[0] for a in ascending.alerts] == [88.0, 93.5, 96.0, 97.25, 120.0, None]
        by_host = await store.incident_alert_page(incident_id, AlertQuery(sort="host", descending=False))
        assert hosts(by_host.alerts) == ["::1", "K-AI-099", "k-ai-002", "k-ai-003", "k-ai-010", "k-db-001"]
        by_gpu = await store.incident_alert_page(incident_id, AlertQuery(sort="gpu", descending=False))
        assert [a.labels["gpu"] for a in by_gpu.alerts] == ["0", "1", "2", "3", "9", "10"]
        by_row = await store.incident_alert_page(incident_id, AlertQuery(label="row", descending=True))
        assert [a.labels["row"] for a in by_row.alerts] == ["D", "D", "C", "C", "C", "C"]
        assert by_value.matching == 6


async def test_an_incidents_alerts_are_filtered_and_paged_by_the_store(opened: Opener) -> None:
    async with opened() as store:
        incident_id = await incident_of(store)
        ai = await store.incident_alert_page(incident_id, AlertQuery(sort="host", descending=False, host="k-AI"))
        assert hosts(ai.alerts) == ["K-AI-099", "k-ai-002", "k-ai-003", "k-ai-010"] and ai.matching == 4
        row_d = await store.incident_alert_page(incident_id, AlertQuery(labels=(("row", "D"),)))
        assert sorted(hosts(row_d.alerts)) == ["k-ai-003", "k-db-001"]
        gpu = await store.incident_alert_page(incident_id, AlertQuery(gpu="10"))
        assert hosts(gpu.alerts) == ["k-ai-010"]
        first = AlertQuery(sort="host", descending=False, per_page=4)
        pages = [await store.incident_alert_page(incident_id, first)]
        pages.append(await store.incident_alert_page(incident_id, AlertQuery(**{**first.__dict__, "page": 2})))
        assert [len(p.alerts) for p in pages] == [4, 2] and {p.matching for p in pages} == {6}
        assert hosts(pages[0].alerts + pages[1].alerts) == hosts(
            (await store.incident_alert_page(incident_id, AlertQuery(sort="host", descending=False))).alerts
        )
        # Acknowledged or not, firing or resolved.
        [acked] = (await store.incident_alert_page(incident_id, AlertQuery(gpu="2"))).alerts
        assert await store.ack(acked.key, "alice", datetime.now(UTC))
        yes = await store.incident_alert_page(incident_id, AlertQuery(acked=True))
        assert [a.acked_by for a in yes.alerts] == ["alice"]
        assert (await store.incident_alert_page(incident_id, AlertQuery(acked=False))).matching == 5
        assert (await store.incident_alert_page(incident_id, AlertQuery(status="resolved"))).matching == 0
        assert (await store.incident_alert_page("no-such-incident", AlertQuery())).alerts == []


async def test_the_list_of_incidents_puts_the_open_ones_first_then_the_most_recent(opened: Opener) -> None:
    clock = FakeClock(datetime.now(UTC))
    async with opened(clock=clock) as store:
        hot = await incident_of(store)  # the oldest, still open
        await clock.advance(60)
        xid = webhook(gpu_alerts(6, host="k-ai-050"), group_key='{}:{alertname="GPUXidError"}')
        await ingest_and_dedup(store, xid)
        events = [e for e in await store.claim_events(100, 3600) if e.alert.labels["alertname"] == "GPUXidError"]
        [newer] = {m.incident_id for m in (await store.attribute_incidents(arrivals(events), RULE)).values()}
        await clock.advance(60)
        resolved = [{**alert, "status": "resolved"} for alert in gpu_alerts(6, host="k-ai-050")]
        await ingest_and_dedup(store, webhook(resolved, group_key='{}:{alertname="GPUXidError"}'))
        await store.advance_incidents({hot: IncidentAdvance(), newer: IncidentAdvance()})
        heads = await store.incident_heads(10)
        assert [(h.id, h.state) for h in heads] == [(hot, "open"), (newer, "resolved")]
        assert heads[1].opened_at > heads[0].opened_at
        assert (heads[0].alerts, heads[0].firing, heads[0].acked) == (6, 6, 0)
        assert (heads[1].alerts, heads[1].firing) == (6, 0)
        assert await store.incident_heads(10, hot) == [heads[0]]
        assert await store.incident_heads(10, "no-such-incident") == []
        assert len(await store.incident_heads(1)) == 1


@pytest.mark.parametrize(
    "wrong",
    [{"sort": "labels"}, {"page": 0}, {"per_page": 501}, {"label": "a-b"}, {"labels": (('x"]', "1"),)}],
)
def test_a_query_the_store_cannot_answer_is_refused_with_words(wrong: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=r"sort by|page|label"):
        AlertQuery(**wrong)

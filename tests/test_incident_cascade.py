"""One cause, one incident, through the pipeline on a real SQLite store and the shipped playbooks: a cooling cascade
(the inlet, then the GPU temperature alerts on the same hosts) is one incident counting each alertname, an
unrelated burst on other hosts at the same time is its own, an OOM kill on a hot host stays alone; every receiver
its members route to gets every version, and a receiver added since hears no ending of what it never saw."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.config import load_config
from bot.incident.lines import with_alerts
from bot.incident.model import IncidentView
from bot.incident.stage import IncidentStage
from bot.models import Delivery
from bot.playbooks import PlaybookSet
from tests.support.bot import write_config
from tests.support.payloads import STARTED, am_alert, webhook
from tests.support.store import ingest_and_dedup, sqlite_store
from tests.test_incident_stage import Stage, stage

ROW_C = [f"c-{n:02d}" for n in range(6)]
OTHERS = [f"d-{n:02d}" for n in range(8)]
# Critical alerts to PagerDuty too; every alert to the console.
ROUTING = {
    "receivers": [{"name": "console", "type": "console"}, {"name": "pager", "type": "console"}],
    "routing": {
        "rules": [
            {"matchers": ['severity="critical"'], "receivers": ["console", "pager"]},
        ],
        "default": ["console"],
    },
}


def alerts(alertname: str, hosts: list[str], gpus: int = 0, **labels: str) -> dict[str, Any]:
    """One notification of `alertname` on `hosts`: one alert per GPU (per host when `gpus` is 0); the inlet alerts
    start first, as they do when a room's cooling fails."""
    started = STARTED - timedelta(minutes=3) if alertname == "InletTemperatureHigh" else STARTED
    found = []
    for host in hosts:
        for gpu in range(gpus) if gpus else [None]:
            extra = {"gpu": str(gpu)} if gpu is not None else {"name": "Inlet Temp"}
            summary = f"{alertname} ({90 + (gpu or 0)} °C)" if gpu is not None else "inlet air (36 °C)"
            annotations = {"summary": summary}
            found.append(am_alert(alertname, starts_at=started, host=host, annotations=annotations, **extra, **labels))
    return webhook(found, group_key=f'{{}}:{{alertname="{alertname}"}}')


async def incidents(s: Stage, receiver: str = "console") -> dict[str, IncidentView]:
    """The newest version of each incident told to `receiver`, by id."""
    found: dict[str, IncidentView] = {}
    for delivery in await s.store.due_deliveries(receiver, 100, "incidents"):
        view = delivery.message.incident
        assert view is not None
        found[view.id] = await with_alerts(view, s.store)
    return found


async def own_messages(s: Stage, receiver: str = "console") -> list[Delivery]:
    return await s.store.due_deliveries(receiver, 1000)


async def test_a_cooling_cascade_is_one_incident_and_an_unrelated_burst_on_other_hosts_its_own(tmp_path: Path) -> None:
    async with stage(tmp_path, ROUTING) as s:
        await s.run(alerts("InletTemperatureHigh", ROW_C, severity="warning"))
        [opened] = (await incidents(s)).values()
        await s.run(
            alerts("GPUTemperatureRising", ROW_C, 8, severity="warning"),
            alerts("GPUTempCritical", ROW_C, 8),
            alerts("GPUMemoryTempHigh", ROW_C, 4, severity="warning"),
            alerts("GPUMemoryTempHigh", ROW_C, 4),  # its critical rule: the same GPUs' memory, counted once
            alerts("GPUXIDError", OTHERS, 2, xid="79"),
            alerts("OOMKillerFired", ROW_C[:1], severity="warning"),
        )
        found = await incidents(s)
        own = await own_messages(s)
    assert len(found) == 2
    cooling = found[opened.id]
    assert cooling.alertnames[0] == "InletTemperatureHigh"  # the upstream symptom: the first to start
    assert [(c.alertname, c.count, c.hosts) for c in cooling.counts] == [
        ("GPUTempCritical", 48, 6),
        ("GPUTemperatureRising", 48, 6),
        ("GPUMemoryTempHigh", 24, 6),
        ("InletTemperatureHigh", 6, 6),
    ]
    assert (cooling.scope.hosts, cooling.scope.gpus, cooling.scope.alerts) == (6, 48, 6 + 48 + 48 + 48)
    assert cooling.scope.value_alertname == "GPUTempCritical" and cooling.severity == "critical"
    assert cooling.title == "InletTemperatureHigh and 3 more on 6 hosts"  # no Prometheus here: no cause
    assert all(line.alertnames == sorted({c.alertname for c in cooling.counts}) for line in cooling.hosts)
    [xid] = [view for view in found.values() if view.id != opened.id]
    assert (xid.alertnames, xid.scope.hosts) == (["GPUXIDError"], 8)
    # The OOM kill on a hot host is told on its own; no alert of the cascade or the burst is.
    assert [d.message.alertname for d in own] == ["OOMKillerFired"]


async def test_every_receiver_its_members_route_to_gets_every_version(tmp_path: Path) -> None:
    """The inlet alerts (warnings) go to the console alone; the GPU alerts that join on their hosts are critical and
    go to the pager too: from then on every version goes to both, and its recovery too."""
    async with stage(tmp_path, ROUTING) as s:
        await s.run(alerts("InletTemperatureHigh", ROW_C, severity="warning"))
        assert await incidents(s, "pager") == {}
        await s.run(alerts("GPUTempCritical", ROW_C[:1], 8))
        [paged] = (await incidents(s, "pager")).values()
        assert paged.scope.hosts == 6 and paged.counts[0].alertname == "GPUTempCritical"
        for delivery in await s.store.due_deliveries("pager", 100, "incidents"):
            await s.store.delivery_succeeded(delivery.id)
        # Only a warning changes now (an inlet alert resolves): the pager, told of the incident, hears of it.
        resolved = alerts("InletTemperatureHigh", ROW_C[:1], severity="warning")
        resolved["alerts"][0]["status"] = "resolved"
        resolved["alerts"][0]["endsAt"] = resolved["alerts"][0]["startsAt"]
        await s.run(resolved)
        [later] = (await incidents(s, "pager")).values()
        assert later.version > paged.version and later.scope.firing == paged.scope.firing - 1


async def test_a_receiver_added_later_hears_no_ending_of_what_it_never_saw(tmp_path: Path) -> None:
    """Told to the console while it fired; the pager is added to the configuration (a restart reads it) before
    the alert resolves: the pager gets no 'resolved' of an alert it never saw firing, the console does."""
    lone = alerts("GPUFellOffTheBus", ["k-ai-01"], 1)
    async with stage(tmp_path, {"routing": {"default": ["console"]}}) as s:
        await s.run(lone)
        [firing] = await own_messages(s)
        await s.store.delivery_succeeded(firing.id)
    ended = {**lone, "status": "resolved", "alerts": [{**lone["alerts"][0], "status": "resolved"}]}
    ended["alerts"][0]["endsAt"] = ended["alerts"][0]["startsAt"]
    async with stage(tmp_path, ROUTING) as s:
        await s.run(ended)
        assert [d.message.event for d in await own_messages(s)] == ["resolved"]
        assert await own_messages(s, "pager") == []


async def test_an_alert_first_heard_of_once_resolved_is_told_to_nobody(tmp_path: Path) -> None:
    """It fired and resolved between two of Alertmanager's notifications of its group (a warning its critical
    variant inhibits, a blip): no receiver saw it firing, so none is told of its ending."""
    blip = alerts("GPUMemoryTempHigh", ["k-ai-01"], 1, severity="warning")
    blip["alerts"][0]["status"] = "resolved"
    blip["alerts"][0]["endsAt"] = blip["alerts"][0]["startsAt"]
    async with stage(tmp_path, ROUTING) as s:
        await s.run(blip)
        assert await own_messages(s) == [] and await own_messages(s, "pager") == []


class SlowAnalyser:
    """An analyser that answers once released, counting what it was asked."""

    per_site = False
    site_labels: list[str] = []

    def __init__(self) -> None:
        self.asked = 0
        self.release = asyncio.Event()

    async def analyse(self, record: Any, sections: Any, firing: Any, origins: Any = ()) -> dict[str, Any]:
        self.asked += 1
        await self.release.wait()
        return {"fleet": "unanswered", "queries": 4}

    async def close(self) -> None:
        return None


async def test_batches_in_flight_together_ask_prometheus_about_an_incident_once(tmp_path: Path) -> None:
    """The worker runs several batches at once: one that changes an incident while its first analysis is under way
    waits for that analysis and takes its answer, so the incident's first card names what it found."""
    config = load_config(write_config(tmp_path, {}))
    playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)
    analyser = SlowAnalyser()
    async with sqlite_store(config.store.path) as store:
        incidents = IncidentStage(store, config.incidents, playbooks, analyser)  # type: ignore[arg-type]
        await ingest_and_dedup(store, alerts("GPUTempCritical", ROW_C, 2))
        events = await store.claim_events(100, 60)
        matched = [(event, playbooks.match(event.alert)) for event in events]
        attribution = await incidents.attribute(matched)
        first = asyncio.ensure_future(incidents.analyse(attribution, matched))
        second = asyncio.ensure_future(incidents.analyse(attribution, matched))
        await asyncio.sleep(0)
        analyser.release.set()
        found = [await first, await second]
    assert analyser.asked == 1
    [(one, answer)] = found[0].items()
    assert found[1] == {one: answer} and answer is not None and answer["queries"] == 4

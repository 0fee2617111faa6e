"""Fleet actions from an incident's card, through the dispatcher and the engine on a real SQLite store with a fake
clock: a click always asks for approval, nothing runs before it; approved, the action runs on every affected GPU
of the configured hosts at `fleet_rate` hosts a minute; the incident's offer, the hosts of the configuration,
cooldowns, the breaker, dry run and the permissions all hold; a click's value picks nothing. And once against a
real sshd whose forced command is the shipped script."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.build import alert_finder, build_executors
from bot.actions.engine import Remediation
from bot.actions.executor import ExecResult, Executor, RunContext
from bot.actions.fleet import FleetRemediation, members_from_views
from bot.actions.runs import ActionRefused
from bot.audit import AuditLog
from bot.config import RemediationConfig
from bot.incident.model import AlertLine, IncidentView, incident_key
from bot.interact.access import Access
from bot.interact.dispatch import Actor, Dispatcher
from bot.interact.fleet import INCIDENT_ACTION, FleetCommands
from bot.interact.remediation import RemediationCommands, SlackAuthorizer
from bot.models import AlertState, short_id
from bot.storage.interface import ActionRun, BreakerState, Store
from tests.support.clock import FakeClock, running
from tests.support.incidents import COOLING, INCIDENT_ID, incident_view
from tests.support.payloads import am_alert, webhook
from tests.support.remediation import RecordingExecutor, Thread, firing_alert, remediation_config
from tests.support.sshd import SSHD, Sshd
from tests.support.store import ingest_and_dedup, sqlite_store
from tests.test_remediation_slack import ADMIN, RESPONDER, VIEWER, interactivity_config
from tests.test_remediation_ssh import ssh_config

POWER, RESTART, RESET_GPU = "lower-power-limit", "restart-dcgm-exporter", "reset-gpu"
HOSTS = ("gpu01", "gpu02", "gpu03")
INCIDENT = incident_key(INCIDENT_ID)


def click_value(action: str, incident: str = INCIDENT_ID) -> str:
    return f'{{"incident": "{incident}", "action": "{action}"}}'


class TimedExecutor(RecordingExecutor):
    """Records the fake clock's time of each run too."""

    def __init__(self, host: str, actions: Sequence[str], clock: FakeClock) -> None:
        super().__init__(host, actions)
        self.clock = clock
        self.times: list[float] = []

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        self.times.append(self.clock.monotonic())
        return await super().run(action, gpu, context)


def view_of(alerts: Sequence[AlertState], actions: Sequence[str]) -> IncidentView:
    lines = [
        AlertLine(
            alert_key=a.key,
            short_id=short_id(a.key),
            alertname=a.labels.get("alertname", ""),
            host=a.labels.get("host", ""),
            gpu=a.labels.get("gpu", ""),
        )
        for a in alerts
    ]
    return incident_view(analysed=True, alerts=lines, cause=COOLING.model_copy(update={"actions": list(actions)}))


@dataclass
class Fleet:
    store: Store
    clock: FakeClock
    thread: Thread
    executors: dict[str, TimedExecutor]
    engine: Remediation
    dispatcher: Dispatcher
    alerts: list[AlertState]
    approvals: list[ActionRun] = field(default_factory=list)

    async def click(self, actor: Actor, action: str, incident: str = INCIDENT_ID) -> str:
        return await self.dispatcher.click(actor, INCIDENT_ACTION, click_value(action, incident))

    async def runs(self) -> list[ActionRun]:
        return await self.store.action_runs(self.clock.now() - timedelta(days=1))

    def ran(self) -> list[tuple[str, str, str | None]]:
        return [(host, action, gpu) for host, e in self.executors.items() for action, gpu in e.ran]


@contextlib.asynccontextmanager
async def fleet(tmp_path: Path, offered: Sequence[str] = (POWER, RESET_GPU), **settings: Any) -> AsyncIterator[Fleet]:
    clock, thread = FakeClock(), Thread()
    config = remediation_config(HOSTS, **{"fleet_rate": "2/min", **settings})
    executors = {host: TimedExecutor(host, [POWER, RESTART, RESET_GPU], clock) for host in HOSTS}
    per_host: dict[str, dict[str, Executor]] = {h: dict.fromkeys(e.actions(), e) for h, e in executors.items()}
    async with sqlite_store(tmp_path) as store:
        access = Access(interactivity_config(), _no_groups, clock)
        authorizer = SlackAuthorizer(access, ConfigAuthorizer(config))
        engine = Remediation(store, config, per_host, thread, authorizer, alert_finder(store), clock=clock)
        alerts = [
            await firing_alert(store, "GPUTempCritical", host=host, gpu=gpu) for host in HOSTS for gpu in ("0", "1")
        ]
        # Members the configuration does not let anything touch: a host it does not list, a GPU that is no index.
        alerts.append(await firing_alert(store, "GPUTempCritical", host="k-rogue", gpu="2"))
        alerts.append(await firing_alert(store, "GPUTempCritical", host="gpu01", gpu="0;reboot"))
        views = {INCIDENT_ID: view_of(alerts, offered)}

        async def lookup(incident_id: str) -> IncidentView | None:
            return views.get(incident_id)

        fleet_remediation = FleetRemediation(store, config, engine, members_from_views(store, lookup), thread, clock)
        dispatcher = Dispatcher(access, AuditLog(store, clock))
        RemediationCommands(engine, access).register(dispatcher)
        FleetCommands(fleet_remediation, access).register(dispatcher)
        setup = Fleet(store, clock, thread, executors, engine, dispatcher, alerts)

        async def watch(run: ActionRun) -> None:
            setup.approvals.append(run)

        engine.watch_approvals(watch)
        try:
            yield setup
        finally:
            await engine.close()


async def _no_groups(group_id: str) -> list[str]:
    return []


async def test_a_fleet_button_waits_for_approval_then_runs_on_every_affected_gpu_at_the_fleet_rate(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as setup:
        # lower-power-limit needs no approval on one alert; on a fleet it always does.
        answer = await setup.click(RESPONDER, POWER)
        assert "It runs only once approved: `approve 1`" in answer
        assert answer.startswith(
            "Asked for lower-power-limit on the incident's 3 hosts, 6 GPUs "
            "(2 alerts left out: no configured host or GPU index), run #1."
        )
        [run] = await setup.runs()
        assert (run.state, run.alert_key, run.target) == ("requested", INCIDENT, "incident inc7q2 (3 hosts)")
        assert setup.ran() == [] and [r.id for r in setup.approvals] == [run.id]
        assert "waiting for approval (`approve 1`)" in setup.thread.texts(INCIDENT)[0]
        async with running(setup.clock):
            assert (await setup.dispatcher.command(ADMIN, "approve 1")).startswith("Approved run #1")
            await setup.engine.drain()
        assert sorted(setup.ran()) == [(h, POWER, g) for h in HOSTS for g in ("0", "1")]
        # 2 hosts a minute: a host every 30 s, its GPUs one after the other.
        assert [setup.executors[h].times for h in HOSTS] == [[0.0, 0.0], [30.0, 30.0], [60.0, 60.0]]
        parent = await setup.store.get_action_run(run.id)
        assert parent is not None and parent.state == "done" and parent.detail == "done on 6 hosts"
        texts = setup.thread.texts(INCIDENT)
        assert texts[-1] == "lower-power-limit (run #1) done: done on 6 hosts"
        # Each GPU's run is in the store, for the cooldowns and the audit log; the member threads stay quiet.
        children = [r for r in await setup.runs() if r.id != run.id]
        assert {(r.target, r.gpu, r.state) for r in children} == {(h, g, "done") for h in HOSTS for g in ("0", "1")}
        assert all(r.approvals == ("slack:U0ADMIN001 ada",) for r in children)
        assert {key for key, _ in setup.thread.messages} == {INCIDENT}
        # Nothing ever reached the host the configuration does not list, nor the GPU named "0;reboot".
        assert all(gpu in ("0", "1") for _, _, gpu in setup.ran())


async def test_a_refused_approval_runs_nothing(tmp_path: Path) -> None:
    async with fleet(tmp_path) as setup:
        await setup.click(RESPONDER, POWER)
        assert (await setup.dispatcher.command(VIEWER, "refuse 1")).startswith("Sorry")
        assert (await setup.dispatcher.command(RESPONDER, "refuse 1")).startswith("Refused run #1")
        assert (await setup.dispatcher.command(ADMIN, "approve 1")).startswith("Refused: run #1 is refused")
        await setup.engine.drain()
        assert setup.ran() == []


@pytest.mark.parametrize(
    ("actor", "value", "answer"),
    [
        (VIEWER, click_value(POWER), "Sorry, `incident_action` needs"),
        (RESPONDER, click_value(RESTART), "Refused: the incident does not offer 'restart-dcgm-exporter'"),
        (RESPONDER, click_value(POWER, "nope"), "Refused: no incident 'nope'"),
        (RESPONDER, click_value(RESET_GPU), "Sorry, `reset-gpu` is dangerous"),
        (RESPONDER, click_value("../../bin/sh"), "Unknown action `../../bin/sh`"),
        (RESPONDER, click_value(POWER, "inc7q2; reboot"), "This button does not name an incident's fleet action"),
        (RESPONDER, '{"incident": ["inc7q2"], "action": "lower-power-limit"}', "does not name"),
        (RESPONDER, "not json", "does not name"),
    ],
)
async def test_what_a_click_may_not_ask_for_is_refused_and_audited(
    tmp_path: Path, actor: Actor, value: str, answer: str
) -> None:
    async with fleet(tmp_path) as setup:
        assert answer in await setup.dispatcher.click(actor, INCIDENT_ACTION, value)
        assert await setup.runs() == []
        entries = await setup.store.audit_log(setup.clock.now() - timedelta(days=1))
        assert [e.outcome for e in entries][-1] in ("refused", "invalid")


async def test_a_dangerous_fleet_action_needs_an_admin_and_is_off_unless_enabled(tmp_path: Path) -> None:
    async with fleet(tmp_path) as setup:
        assert "not enabled" in await setup.click(ADMIN, RESET_GPU)
    async with fleet(tmp_path / "enabled", actions={RESET_GPU: {"enabled": True}}) as setup:
        assert "It runs only once approved" in await setup.click(ADMIN, RESET_GPU)
        assert (await setup.dispatcher.command(RESPONDER, "approve 1")).startswith("Refused")
        assert setup.ran() == []


async def test_dry_run_says_what_would_run_and_runs_nothing(tmp_path: Path) -> None:
    async with fleet(tmp_path, dry_run=True) as setup:
        answer = await setup.click(RESPONDER, POWER)
        assert answer.startswith("Dry run of lower-power-limit (run #1): would run lower-power-limit on gpu01; on 3")
        [run] = await setup.runs()
        assert run.state == "dry-run" and setup.ran() == [] and setup.approvals == []


async def test_a_host_in_cooldown_is_skipped_and_the_breaker_stops_the_run_before_its_next_host(
    tmp_path: Path,
) -> None:
    async with fleet(tmp_path) as setup:
        # gpu01 had its power limit lowered a minute ago (a run of its own): its cooldown is not over.
        assert (await setup.engine.request(POWER, setup.alerts[0].key, "cli:alice")).state == "approved"
        await setup.engine.drain()
        await setup.clock.advance(60)
        await setup.click(RESPONDER, POWER)
        fleet_run = (await setup.runs())[-1]
        opened = setup.executors["gpu02"]

        async def open_the_breaker(action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
            await setup.store.set_breaker(BreakerState(setup.clock.now(), "an admin opened it"))
            return await TimedExecutor.run(opened, action, gpu, context)

        opened.run = open_the_breaker  # type: ignore[method-assign]
        async with running(setup.clock):
            await setup.dispatcher.command(ADMIN, f"approve {fleet_run.id}")
            await setup.engine.drain()
        assert setup.ran() == [("gpu01", POWER, "0"), ("gpu02", POWER, "0"), ("gpu02", POWER, "1")]
        done = await setup.store.get_action_run(fleet_run.id)
        assert done is not None and done.state == "done"
        assert done.detail.startswith("done on 2 hosts; skipped 2: gpu01 (cooldown: lower-power-limit ran on gpu01 at")
        assert done.detail.endswith("gpu03 (circuit breaker open)")
        # With the breaker open, the card's button is refused at once.
        assert "circuit breaker is open" in await setup.click(RESPONDER, POWER)


async def test_stop_ends_a_fleet_run_before_its_next_host(tmp_path: Path) -> None:
    async with fleet(tmp_path) as setup:
        await setup.click(RESPONDER, POWER)
        first = setup.executors["gpu01"]
        first.hold = asyncio.Event()
        async with running(setup.clock):
            await setup.dispatcher.command(ADMIN, "approve 1")
            await first.started.wait()
            assert (await setup.dispatcher.command(VIEWER, "stop 1")).startswith("Sorry")
            assert (await setup.dispatcher.command(RESPONDER, "stop 1")).startswith("Stopping run #1")
            first.hold.set()
            await setup.engine.drain()
        assert setup.ran() == [("gpu01", POWER, "0"), ("gpu01", POWER, "1")]
        done = await setup.store.get_action_run(1)
        assert done is not None and done.state == "done"
        stopper = "slack:U0RESPOND1 alice"
        assert done.detail == f"done on 2 hosts; skipped 2: gpu02 (stopped by {stopper}), gpu03 (stopped by {stopper})"
        assert "Refused: run #1 is no fleet run under way" in await setup.dispatcher.command(RESPONDER, "stop 1")


@pytest.mark.skipif(not os.path.exists(SSHD), reason="needs Debian's openssh-server (scripts/test)")
async def test_a_fleet_action_reaches_each_configured_host_through_its_forced_command(
    tmp_path: Path, sshd: Sshd
) -> None:
    clock, thread = FakeClock(), Thread()
    hosts = {host: {"ssh": ssh_config(sshd)} for host in ("gpu01", "gpu02")}
    config = RemediationConfig.model_validate({"hosts": hosts, "fleet_rate": "60/min", "approvers": ["cli:bob"]})
    executors = build_executors(config)
    async with sqlite_store(tmp_path) as store:
        engine = Remediation(
            store, config, executors, thread, ConfigAuthorizer(config), alert_finder(store), clock=clock
        )
        alerts = [await firing_alert(store, instance=f"{host}:9400") for host in ("gpu01", "gpu02", "gpu01")]
        alerts.append(await firing_alert(store, instance="gpu01; docker rm -f vllm:9400"))
        view = view_of(alerts, [RESTART])

        async def lookup(incident_id: str) -> IncidentView | None:
            return view

        fleet_remediation = FleetRemediation(store, config, engine, members_from_views(store, lookup), thread, clock)
        run = await fleet_remediation.request(INCIDENT_ID, RESTART, "cli:alice")
        with pytest.raises(ActionRefused, match="may not approve"):
            await engine.approve(run.id, "cli:mallory")
        async with running(clock):
            await engine.approve(run.id, "cli:bob")
            await engine.drain()
        done = await store.get_action_run(run.id)
        assert done is not None and done.state == "done", done
    assert sshd.verbs() == [RESTART, RESTART]
    assert sshd.docker_calls() == ["restart -t 10 dcgm-exporter"] * 2


async def test_an_incident_whose_alerts_resolved_before_the_approval_has_nothing_left_to_do(tmp_path: Path) -> None:
    async with fleet(tmp_path) as setup:
        await setup.click(RESPONDER, POWER)
        for alert in setup.alerts:
            labels = {k: v for k, v in alert.labels.items() if k not in ("alertname", "severity")}
            resolved = am_alert(alert.labels["alertname"], status="resolved", **labels)
            await ingest_and_dedup(setup.store, webhook([resolved], group_key=f"{{}}:{{{resolved['fingerprint']}}}"))
        assert await setup.store.list_alerts("firing") == []
        await setup.dispatcher.command(ADMIN, "approve 1")
        await setup.engine.drain()
        done = await setup.store.get_action_run(1)
        assert done is not None and done.state == "done" and done.detail.startswith("nothing to do")
        assert setup.ran() == []

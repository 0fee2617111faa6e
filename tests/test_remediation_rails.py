"""The remediation engine's safety rails on a real SQLite store, with a fake clock: cooldown, approval (and an
unauthorized approver), expiry, dry-run, dangerous actions, the concurrency limit, the circuit breaker, label
values that try to pick a target, and a restart in the middle of a run."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from bot.action_catalog import ACTIONS
from bot.actions.kubernetes import NODE_ACTIONS
from bot.actions.policy import AutomaticPolicy
from bot.actions.runs import ActionRefused
from bot.actions.slurm import SLURM_ACTIONS
from bot.actions.ssh import SSH_VERBS
from bot.config import DOCKER_ACTIONS
from bot.evidence import Enrichment, EnrichmentSection, Verdict, XidEvidence
from bot.metrics import Metrics
from bot.storage.interface import Store
from bot.verdict import STALE_XID_GAUGE
from tests.support.clock import FakeClock
from tests.support.remediation import RecordingExecutor, Thread, engine, firing_alert, remediation_config
from tests.support.store import route_event, sqlite_store

RESTART = "restart-dcgm-exporter"
STEPS = "gpu_alert_bot_remediation_steps_total"


async def audit_outcomes(store: Store, clock: FakeClock) -> list[tuple[str, str, str]]:
    return [(e.actor, e.action, e.outcome) for e in await store.audit_log(clock.now() - timedelta(days=1))]


async def test_an_action_runs_then_the_cooldown_refuses_it_on_that_host_until_it_has_passed(tmp_path: Path) -> None:
    clock, thread = FakeClock(), Thread()
    executor = RecordingExecutor("gpu01", [RESTART])
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = engine(store, remediation_config(["gpu01"]), {"gpu01": executor}, clock, thread)

        first = await bot.request(RESTART, alert.fingerprint, "cli:alice")
        await bot.drain()
        assert executor.ran == [(RESTART, None)]
        assert (await store.get_action_run(first.id)).state == "done"  # type: ignore[union-attr]

        await clock.advance(29 * 60)
        ran_at = (await store.get_action_run(first.id)).updated_at  # type: ignore[union-attr]
        allowed = ran_at + timedelta(minutes=30)
        with pytest.raises(ActionRefused, match=f"^cooldown: .* next allowed after {allowed:%H:%M:%S} UTC$"):
            await bot.request(RESTART, alert.fingerprint, "cli:alice")  # refused when asked, no run recorded
        await bot.drain()
        assert [run.id for run in await store.action_runs(clock.now() - timedelta(days=1))] == [first.id]
        assert executor.ran == [(RESTART, None)]
        assert any("cooldown" in text for text in thread.texts(alert.key))

        await clock.advance(2 * 60)
        third = await bot.request(RESTART, alert.fingerprint, "cli:alice")
        await bot.drain()
        assert (await store.get_action_run(third.id)).state == "done"  # type: ignore[union-attr]
        assert len(executor.ran) == 2
        outcomes = await audit_outcomes(store, clock)
        assert ("cli:alice", f"run {RESTART}", "refused") in outcomes
        assert outcomes.count(("cli:alice", f"run {RESTART}", "done")) == 2


async def test_an_action_needing_approval_waits_refuses_an_unauthorized_approver_and_runs_once_approved(
    tmp_path: Path,
) -> None:
    clock, thread = FakeClock(), Thread()
    executor = RecordingExecutor("gpu01", [RESTART])
    config = remediation_config(["gpu01"], approvers=["cli:bob"], actions={RESTART: {"approval": True}})
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = engine(store, config, {"gpu01": executor}, clock, thread)

        run = await bot.request(RESTART, alert.fingerprint, "cli:alice")
        await bot.drain()
        assert run.state == "requested" and executor.ran == []
        assert any(f"approve {run.id}" in text for text in thread.texts(alert.key))

        with pytest.raises(ActionRefused, match="may not approve"):
            await bot.approve(run.id, "cli:mallory")
        await bot.drain()
        assert executor.ran == []

        approved = await bot.approve(run.id, "cli:bob")
        await bot.drain()
        assert approved.state == "approved" and approved.approvals == ("cli:bob",)
        assert executor.ran == [(RESTART, None)]
        outcomes = await audit_outcomes(store, clock)
        assert ("cli:mallory", f"approve {RESTART}", "refused") in outcomes
        assert ("cli:bob", f"approve {RESTART}", "approved") in outcomes

        with pytest.raises(ActionRefused, match="not waiting for approval"):
            await bot.approve(run.id, "cli:bob")


async def test_a_refused_request_never_runs(tmp_path: Path) -> None:
    clock = FakeClock()
    executor = RecordingExecutor("gpu01", [RESTART])
    config = remediation_config(["gpu01"], approvers=["cli:bob"], actions={RESTART: {"approval": True}})
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = engine(store, config, {"gpu01": executor}, clock)
        run = await bot.request(RESTART, alert.fingerprint, "cli:alice")
        refused = await bot.refuse(run.id, "cli:bob")
        with pytest.raises(ActionRefused):
            await bot.approve(run.id, "cli:bob")
        await bot.drain()
        assert refused.state == "refused" and executor.ran == []


async def test_an_approval_expires(tmp_path: Path) -> None:
    clock, thread = FakeClock(), Thread()
    executor = RecordingExecutor("gpu01", [RESTART])
    config = remediation_config(
        ["gpu01"], approvers=["cli:bob"], approval_ttl="15m", actions={RESTART: {"approval": True}}
    )
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = engine(store, config, {"gpu01": executor}, clock, thread)
        run = await bot.request(RESTART, alert.fingerprint, "cli:alice")
        await clock.advance(15 * 60 + 1)
        with pytest.raises(ActionRefused, match="expired"):
            await bot.approve(run.id, "cli:bob")
        await bot.drain()
        assert (await store.get_action_run(run.id)).state == "expired"  # type: ignore[union-attr]
        assert executor.ran == []
        assert any("expired" in text for text in thread.texts(alert.key))


@pytest.mark.parametrize(
    ("settings", "asked"),
    [({"dry_run": True}, False), ({"actions": {RESTART: {"dry_run": True}}}, False), ({}, True)],
    ids=["global", "per-action", "per-request"],
)
async def test_a_dry_run_says_what_it_would_do_and_does_nothing(
    tmp_path: Path, settings: dict[str, object], asked: bool
) -> None:
    clock, thread = FakeClock(), Thread()
    executor = RecordingExecutor("gpu01", [RESTART])
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = engine(store, remediation_config(["gpu01"], **settings), {"gpu01": executor}, clock, thread)
        run = await bot.request(RESTART, alert.fingerprint, "cli:alice", dry_run=asked)
        await bot.drain()
        assert run.state == "dry-run" and run.dry_run
        assert executor.ran == []
        assert thread.texts(alert.key) == [
            f"Dry run of {RESTART} (run #{run.id}, cli:alice): would run {RESTART} on gpu01"
        ]
        assert ("cli:alice", f"run {RESTART}", "dry-run") in await audit_outcomes(store, clock)


async def test_dangerous_actions_are_off_unless_enabled_and_then_need_two_admins(tmp_path: Path) -> None:
    clock = FakeClock()
    executor = RecordingExecutor("gpu01", ["reset-gpu"])
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, "GPUXidError", instance="gpu01:9400", gpu="3")
        off = engine(store, remediation_config(["gpu01"]), {"gpu01": executor}, clock)
        assert "reset-gpu" not in off.executable_actions()
        with pytest.raises(ActionRefused, match="not enabled"):
            await off.request("reset-gpu", alert.fingerprint, "cli:alice")

        config = remediation_config(
            ["gpu01"],
            approvers=["cli:bob"],
            admins=["cli:carol", "cli:dave"],
            second_approver=True,
            actions={"reset-gpu": {"enabled": True}},
        )
        bot = engine(store, config, {"gpu01": executor}, clock)
        assert bot.executable_actions() == {"reset-gpu"}
        run = await bot.request("reset-gpu", alert.fingerprint, "cli:alice")
        assert run.state == "requested"
        with pytest.raises(ActionRefused, match="may not approve"):
            await bot.approve(run.id, "cli:bob")  # an approver, not an admin
        first = await bot.approve(run.id, "cli:carol")
        await bot.drain()
        assert first.state == "requested" and executor.ran == []
        with pytest.raises(ActionRefused, match="already approved"):
            await bot.approve(run.id, "cli:carol")
        second = await bot.approve(run.id, "cli:dave")
        await bot.drain()
        assert second.state == "approved" and executor.ran == [("reset-gpu", "3")]


async def test_the_concurrency_limit_refuses_an_action_while_others_run(tmp_path: Path) -> None:
    clock = FakeClock()
    executors = {host: RecordingExecutor(host, [RESTART]) for host in ("gpu01", "gpu02")}
    executors["gpu01"].hold = asyncio.Event()
    async with sqlite_store(tmp_path) as store:
        alerts = [await firing_alert(store, instance=f"{host}:9400") for host in executors]
        bot = engine(store, remediation_config(list(executors), max_concurrent=1), executors, clock)
        first = await bot.request(RESTART, alerts[0].fingerprint, "cli:alice")
        await executors["gpu01"].started.wait()
        second = await bot.request(RESTART, alerts[1].fingerprint, "cli:alice")
        while (await store.get_action_run(second.id)).state == "approved":  # type: ignore[union-attr]
            await asyncio.sleep(0)
        busy = await store.get_action_run(second.id)
        assert busy is not None and busy.state == "refused" and "limit 1" in busy.detail
        assert executors["gpu02"].ran == []

        executors["gpu01"].hold.set()
        await bot.drain()
        assert (await store.get_action_run(first.id)).state == "done"  # type: ignore[union-attr]
        third = await bot.request(RESTART, alerts[1].fingerprint, "cli:alice")
        await bot.drain()
        assert (await store.get_action_run(third.id)).state == "done"  # type: ignore[union-attr]


async def test_the_circuit_breaker_stops_automatic_actions_across_too_many_hosts_until_an_admin_resets_it(
    tmp_path: Path,
) -> None:
    clock, thread = FakeClock(), Thread()
    hosts = ["gpu01", "gpu02", "gpu03", "gpu04"]
    executors = {host: RecordingExecutor(host, [RESTART]) for host in hosts}
    config = remediation_config(hosts, admins=["cli:root"], circuit_breaker={"max_hosts": 2, "window": "10m"})
    metrics = Metrics()
    async with sqlite_store(tmp_path) as store:
        alerts = {host: await firing_alert(store, instance=f"{host}:9400") for host in hosts}
        bot = engine(store, config, executors, clock, thread, metrics)
        assert metrics.registry.get_sample_value(STEPS, {"action": RESTART, "outcome": "refused"}) == 0
        for host in hosts[:2]:
            await bot.request(RESTART, alerts[host].fingerprint, "bot", automatic=True)
        with pytest.raises(ActionRefused, match="circuit breaker opened"):
            await bot.request(RESTART, alerts["gpu03"].fingerprint, "bot", automatic=True)
        await bot.drain()
        assert [host for host in hosts if executors[host].ran] == ["gpu01", "gpu02"]
        assert await bot.breaker() is not None
        assert metrics.registry.get_sample_value("gpu_alert_bot_remediation_breaker_open") == 1
        assert metrics.registry.get_sample_value(STEPS, {"action": RESTART, "outcome": "refused"}) == 1
        assert metrics.registry.get_sample_value(STEPS, {"action": RESTART, "outcome": "done"}) == 2

        await clock.advance(3600)  # the window has passed: the breaker stays open all the same
        with pytest.raises(ActionRefused, match="circuit breaker open since"):
            await bot.request(RESTART, alerts["gpu04"].fingerprint, "bot", automatic=True)
        manual = await bot.request(RESTART, alerts["gpu04"].fingerprint, "cli:alice")  # people still may
        await bot.drain()
        assert (await store.get_action_run(manual.id)).state == "done"  # type: ignore[union-attr]

        with pytest.raises(ActionRefused, match="not a remediation admin"):
            await bot.reset_breaker("cli:alice")
        await bot.reset_breaker("cli:root")
        assert await bot.breaker() is None
        assert metrics.registry.get_sample_value("gpu_alert_bot_remediation_breaker_open") == 0
        run = await bot.request(RESTART, alerts["gpu03"].fingerprint, "bot", automatic=True)
        await bot.drain()
        assert (await store.get_action_run(run.id)).state == "done"  # type: ignore[union-attr]
        outcomes = await audit_outcomes(store, clock)
        assert ("bot", "circuit-breaker", "opened") in outcomes
        assert ("cli:alice", "circuit-breaker", "refused") in outcomes
        assert ("cli:root", "circuit-breaker", "reset") in outcomes


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({"instance": "gpu09:9400"}, "not a configured remediation target"),
        ({"host": "../../etc", "instance": "gpu01:9400"}, "not a configured remediation target"),
        ({"instance": "gpu01:9400", "gpu": "0; reboot"}, "not a GPU index"),
        ({"job": "dcgm"}, "has none of the labels"),
    ],
    ids=["unlisted-host", "path-as-host", "shell-in-gpu", "no-host"],
)
async def test_label_values_only_select_a_configured_target(
    tmp_path: Path, labels: dict[str, str], reason: str
) -> None:
    clock, thread = FakeClock(), Thread()
    executor = RecordingExecutor("gpu01", ["collect-diagnostics"])
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, "GPUXidError", **labels)
        bot = engine(store, remediation_config(["gpu01"]), {"gpu01": executor}, clock, thread)
        with pytest.raises(ActionRefused, match=reason):
            await bot.request("collect-diagnostics", alert.fingerprint, "cli:alice")
        await bot.drain()
        assert executor.ran == []
        assert ("cli:alice", "run collect-diagnostics", "refused") in await audit_outcomes(store, clock)
        assert any(reason in text for text in thread.texts(alert.key))


async def test_after_a_restart_an_approved_run_runs_and_an_interrupted_one_is_reported_not_repeated(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    hosts = ["gpu01", "gpu02"]
    config = remediation_config(hosts, approvers=["cli:bob"], actions={RESTART: {"approval": True}})
    async with sqlite_store(tmp_path) as store:
        alerts = {host: await firing_alert(store, instance=f"{host}:9400") for host in hosts}
        held = {host: RecordingExecutor(host, [RESTART]) for host in hosts}
        held["gpu01"].hold = asyncio.Event()
        before = engine(store, config, held, clock)
        interrupted = await before.request(RESTART, alerts["gpu01"].fingerprint, "cli:alice")
        await before.approve(interrupted.id, "cli:bob")
        await held["gpu01"].started.wait()
        waiting = await before.request(RESTART, alerts["gpu02"].fingerprint, "cli:alice")
        await store.transition_action_run(waiting.id, "requested", "approved", clock.now(), approvals=["cli:bob"])
        await before.close()  # the process dies: one run mid-action, one approved and not started

    async with sqlite_store(tmp_path) as store:
        after_executors = {host: RecordingExecutor(host, [RESTART]) for host in hosts}
        after = engine(store, config, after_executors, clock)
        await after.resume()
        await after.drain()
        assert after_executors["gpu01"].ran == []
        gone = await store.get_action_run(interrupted.id)
        assert gone is not None and gone.state == "failed" and "interrupted" in gone.detail
        assert after_executors["gpu02"].ran == [(RESTART, None)]
        assert (await store.get_action_run(waiting.id)).state == "done"  # type: ignore[union-attr]


def test_every_remediation_action_in_the_registry_has_an_executor() -> None:
    conversation = {"ack", "silence-1h", "silence-4h", "silence-24h"}
    implemented = set(SSH_VERBS) | NODE_ACTIONS | DOCKER_ACTIONS | set(SLURM_ACTIONS)
    assert set(ACTIONS) - conversation <= implemented


async def test_a_request_nobody_approves_expires_by_itself(tmp_path: Path) -> None:
    clock, thread = FakeClock(), Thread()
    config = remediation_config(["gpu01"], approval_ttl="15m", actions={RESTART: {"approval": True}})
    async with sqlite_store(tmp_path) as store:
        alert = await firing_alert(store, instance="gpu01:9400")
        bot = engine(store, config, {"gpu01": RecordingExecutor("gpu01", [RESTART])}, clock, thread)
        run = await bot.request(RESTART, alert.fingerprint, "cli:alice")
        await clock.advance(14 * 60)
        await bot.expire_stale()
        assert (await store.get_action_run(run.id)).state == "requested"  # type: ignore[union-attr]
        await clock.advance(2 * 60)
        await bot.expire_stale()
        assert (await store.get_action_run(run.id)).state == "expired"  # type: ignore[union-attr]
        assert thread.texts(alert.key)[-1] == f"Run #{run.id} ({RESTART}) expired before it was approved"
        assert ("bot", f"run {RESTART}", "expired") in await audit_outcomes(store, clock)


async def test_the_automatic_policy_asks_once_per_alert_and_only_when_enabled(tmp_path: Path) -> None:
    clock = FakeClock()
    executor = RecordingExecutor("gpu01", [RESTART])
    async with sqlite_store(tmp_path) as store:
        blind = await firing_alert(store, "DCGMExporterNoGPUs", instance="gpu01:9400")
        await firing_alert(store, "GPUTempCritical", instance="gpu01:9400", gpu="0")
        off = engine(store, remediation_config(["gpu01"]), {"gpu01": executor}, clock)
        assert not AutomaticPolicy(off, store, clock).enabled()

        config = remediation_config(["gpu01"], actions={RESTART: {"automatic": True}})
        bot = engine(store, config, {"gpu01": executor}, clock)
        policy = AutomaticPolicy(bot, store, clock)
        assert policy.enabled()
        for _ in range(2):
            await policy.check()
            await bot.drain()
        await AutomaticPolicy(bot, store, clock).check()  # after a restart of the bot too
        await bot.drain()
        assert executor.ran == [(RESTART, None)]
        runs = await store.action_runs(clock.now() - timedelta(days=1))
        assert [(run.alert_key, run.automatic, run.requested_by) for run in runs] == [(blind.key, True, "bot")]


async def _enrich_firing_events(store: Store, enrichment: Enrichment) -> None:
    for event in await store.claim_events(100, 60):
        await route_event(store, event.id, enrichment.model_dump(mode="json"), [])


async def test_the_policy_restarts_the_exporter_for_an_xid_alert_judged_a_stale_gauge(tmp_path: Path) -> None:
    clock = FakeClock()
    executor = RecordingExecutor("gpu01", [RESTART])
    stale = Verdict(name=STALE_XID_GAUGE, headline="probably a stale gauge", line="no Xid in the kernel log")
    judged = Enrichment(
        sections=[
            EnrichmentSection(name="xid", title="Kernel Xid", status="ok", data=XidEvidence(scope="gpu", verdict=stale))
        ]
    )
    async with sqlite_store(tmp_path) as store:
        fresh = await firing_alert(store, "GPUXIDError", instance="gpu01:9400", gpu="1")
        await _enrich_firing_events(store, Enrichment())
        gauge = await firing_alert(store, "GPUXIDError", instance="gpu01:9400", gpu="2")
        await _enrich_firing_events(store, judged)
        config = remediation_config(["gpu01"], actions={RESTART: {"automatic": True}})
        bot = engine(store, config, {"gpu01": executor}, clock)

        await AutomaticPolicy(bot, store, clock).check()
        await bot.drain()

        assert executor.ran == [(RESTART, "2")]  # the judged GPU's alert only, not the fresh Xid's
        runs = await store.action_runs(clock.now() - timedelta(days=1))
        assert [run.alert_key for run in runs] == [gauge.key]
        assert fresh.key != gauge.key

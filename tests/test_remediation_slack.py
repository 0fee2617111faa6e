"""Remediation from Slack through the dispatcher, on a real SQLite store with a fake clock: `run`, the action
buttons, `approve` and `refuse` judged by the Slack roles, expiry, dangerous actions, `reset-breaker`, and
alert labels that try to pick a host."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.build import alert_finder
from bot.actions.engine import Remediation
from bot.actions.executor import Executor
from bot.audit import AuditLog
from bot.config import InteractivityConfig
from bot.interact.access import Access
from bot.interact.dispatch import Actor, Dispatcher
from bot.interact.remediation import RemediationCommands, SlackAuthorizer
from bot.models import AlertState, short_id
from bot.storage.interface import BreakerState, Store
from tests.support.clock import FakeClock
from tests.support.remediation import RecordingExecutor, Thread, firing_alert, remediation_config
from tests.support.store import sqlite_store

RESTART, RESET_GPU = "restart-dcgm-exporter", "reset-gpu"
VIEWER = Actor("U0VIEWER01", "victor")
RESPONDER = Actor("U0RESPOND1", "alice")
ADMIN = Actor("U0ADMIN001", "ada")
SECOND_ADMIN = Actor("U0ADMIN002", "bob")


@dataclass
class Setup:
    store: Store
    clock: FakeClock
    thread: Thread
    executor: RecordingExecutor
    engine: Remediation
    dispatcher: Dispatcher
    alert: AlertState

    async def audit(self) -> list[tuple[str, str, str]]:
        entries = await self.store.audit_log(self.clock.now() - timedelta(days=1))
        return [(e.actor, e.action, e.outcome) for e in entries]

    async def state(self, run_id: int) -> str:
        run = await self.store.get_action_run(run_id)
        assert run is not None
        return run.state


def interactivity_config(**permissions: str) -> InteractivityConfig:
    return InteractivityConfig.model_validate(
        {
            "receiver": "slack",
            "signing_secret_file": __file__,
            "roles": [
                {"name": "viewer", "users": [VIEWER.user_id]},
                {"name": "responder", "users": [RESPONDER.user_id]},
                {"name": "admin", "users": [ADMIN.user_id, SECOND_ADMIN.user_id]},
            ],
            "permissions": permissions,
        }
    )


async def _no_groups(group_id: str) -> list[str]:
    return []


@contextlib.asynccontextmanager
async def slack_remediation(tmp_path: Path, **settings: Any) -> AsyncIterator[Setup]:
    clock, thread = FakeClock(), Thread()
    executor = RecordingExecutor("gpu01", [RESTART, RESET_GPU, "collect-diagnostics"])
    config = remediation_config(["gpu01"], **settings)
    async with sqlite_store(tmp_path) as store:
        access = Access(interactivity_config(), _no_groups, clock)
        executors: dict[str, dict[str, Executor]] = {"gpu01": dict.fromkeys(executor.actions(), executor)}
        authorizer = SlackAuthorizer(access, ConfigAuthorizer(config))
        engine = Remediation(store, config, executors, thread, authorizer, alert_finder(store), clock=clock)
        dispatcher = Dispatcher(access, AuditLog(store, clock))
        RemediationCommands(engine, access).register(dispatcher)
        alert = await firing_alert(store, host="gpu01", gpu="3")
        try:
            yield Setup(store, clock, thread, executor, engine, dispatcher, alert)
        finally:
            await engine.close()


def run_number(reply: str) -> int:
    return int(reply.split("(run #", 1)[1].split(")", 1)[0])


async def test_a_responder_runs_an_action_from_the_command_and_from_its_button(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path) as s:
        reply = await s.dispatcher.command(RESPONDER, f"run {RESTART} {short_id(s.alert.key)}")
        assert reply.startswith(f"Started {RESTART} on gpu01 gpu 3 (run #")
        await s.engine.drain()
        reply = await s.dispatcher.click(RESPONDER, "collect-diagnostics", s.alert.key)
        await s.engine.drain()
        assert s.executor.ran == [(RESTART, "3"), ("collect-diagnostics", "3")]
        assert ("slack:U0RESPOND1 alice", f"run {RESTART}", "done") in await s.audit()
        assert any(f"{RESTART} on gpu01 done" in text for text in s.thread.texts(s.alert.key))


async def test_a_viewer_may_not_run_and_nothing_runs(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path) as s:
        reply = await s.dispatcher.command(VIEWER, f"run {RESTART} {short_id(s.alert.key)}")
        assert reply == "Sorry, `run` needs the responder role."
        assert await s.dispatcher.click(VIEWER, RESTART, s.alert.key) == f"Sorry, `{RESTART}` needs the responder role."
        assert s.executor.ran == []
        assert await s.audit() == [
            ("slack:U0VIEWER01 victor", "run", "refused"),
            ("slack:U0VIEWER01 victor", RESTART, "refused"),
        ]


async def test_dry_run_flag_says_what_would_run(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path) as s:
        reply = await s.dispatcher.command(RESPONDER, f"run {RESTART} {short_id(s.alert.key)} --dry-run")
        assert reply.startswith(f"Dry run of {RESTART} on gpu01 gpu 3")
        await s.engine.drain()
        assert s.executor.ran == []


async def test_approval_by_an_admin_runs_and_an_unauthorized_approver_is_refused(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path, actions={RESET_GPU: {"enabled": True}}) as s:
        reply = await s.dispatcher.command(ADMIN, f"run {RESET_GPU} {short_id(s.alert.key)}")
        assert "waits for approval" in reply
        run_id = run_number(reply)
        # A responder may approve guarded actions, not dangerous ones: the engine's authorizer says no.
        refused = await s.dispatcher.command(RESPONDER, f"approve {run_id}")
        assert refused == f"Refused: slack:U0RESPOND1 alice may not approve {RESET_GPU}"
        assert await s.state(run_id) == "requested"
        assert s.executor.ran == []
        assert ("slack:U0RESPOND1 alice", f"approve {RESET_GPU}", "refused") in await s.audit()

        assert (await s.dispatcher.command(SECOND_ADMIN, f"approve {run_id}")).startswith(f"Approved run #{run_id}")
        await s.engine.drain()
        assert s.executor.ran == [(RESET_GPU, "3")]
        assert any("slack:U0ADMIN002 bob approved" in text for text in s.thread.texts(s.alert.key))


async def test_a_responder_cannot_request_a_dangerous_action(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path, actions={RESET_GPU: {"enabled": True}}) as s:
        reply = await s.dispatcher.command(RESPONDER, f"run {RESET_GPU} {short_id(s.alert.key)}")
        assert reply == f"Sorry, `{RESET_GPU}` is dangerous: it needs the admin role."
        assert await s.dispatcher.click(RESPONDER, RESET_GPU, s.alert.key) == "Sorry, `reset-gpu` needs the admin role."
        assert await s.store.action_runs(s.clock.now() - timedelta(days=1)) == []


async def test_an_expired_approval_changes_nothing(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path, actions={RESTART: {"approval": True}}) as s:
        reply = await s.dispatcher.command(RESPONDER, f"run {RESTART} {short_id(s.alert.key)}")
        run_id = run_number(reply)
        await s.clock.advance(16 * 60)
        answer = await s.dispatcher.command(ADMIN, f"approve {run_id}")
        assert answer == f"Refused: run #{run_id} expired: approvals last 15 min"
        await s.engine.drain()
        assert s.executor.ran == []
        assert await s.state(run_id) == "expired"


async def test_refuse_from_slack_ends_the_request(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path, actions={RESTART: {"approval": True}}) as s:
        run_id = run_number(await s.dispatcher.command(RESPONDER, f"run {RESTART} {short_id(s.alert.key)}"))
        assert await s.dispatcher.command(ADMIN, f"refuse #{run_id}") == f"Refused run #{run_id} ({RESTART})."
        assert await s.state(run_id) == "refused"
        assert "Refused: " in await s.dispatcher.command(ADMIN, f"approve {run_id}")
        assert s.executor.ran == []


async def test_reset_breaker_needs_an_admin(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path) as s:
        await s.store.set_breaker(BreakerState(s.clock.now(), "4 hosts"))
        assert await s.dispatcher.command(RESPONDER, "reset-breaker") == "Sorry, `reset-breaker` needs the admin role."
        assert await s.store.get_breaker() is not None
        assert (await s.dispatcher.command(ADMIN, "reset-breaker")).startswith("Circuit breaker reset")
        assert await s.store.get_breaker() is None


async def test_labels_cannot_pick_a_host_the_config_does_not_list(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path) as s:
        crafted = await firing_alert(s.store, "GPUMissing", host="gpu02;reboot", instance="gpu01:9400")
        reply = await s.dispatcher.command(RESPONDER, f"run {RESTART} {short_id(crafted.key)}")
        assert reply.startswith("Refused: host 'gpu02;reboot' is not a configured remediation target")
        await s.engine.drain()
        assert s.executor.ran == []


async def test_bad_input_gets_usage(tmp_path: Path) -> None:
    async with slack_remediation(tmp_path) as s:
        assert "Give an action and an alert id." in await s.dispatcher.command(RESPONDER, "run")
        assert "Unknown action `rm`." in await s.dispatcher.command(RESPONDER, "run rm x")
        assert "Give one run number" in await s.dispatcher.command(RESPONDER, "approve abc")
        assert await s.dispatcher.command(RESPONDER, "approve 99") == "Refused: no run #99"

"""Pieces for remediation tests: an executor that records what it ran (and can be held mid-action), an
announcer that keeps the thread's messages, and alerts put in a real store."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.build import alert_finder
from bot.actions.engine import Remediation
from bot.actions.executor import ExecResult, Executor, RunContext
from bot.config import RemediationConfig
from bot.metrics import Metrics
from bot.models import AlertState
from bot.storage.interface import Store
from bot.store.sqlite import SqliteStore
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, webhook
from tests.support.store import ingest_and_dedup


class RecordingExecutor:
    kind = "recording"

    def __init__(self, host: str, actions: Sequence[str], ok: bool = True) -> None:
        self.host = host
        self._actions = frozenset(actions)
        self.ok = ok
        self.ran: list[tuple[str, str | None]] = []
        self.hold: asyncio.Event | None = None  # set: the action finishes; None: it finishes at once
        self.started = asyncio.Event()

    def actions(self) -> frozenset[str]:
        return self._actions

    def describe(self, action: str, gpu: str | None, context: RunContext | None = None) -> str:
        return f"{action} on {self.host}"

    async def run(self, action: str, gpu: str | None, context: RunContext | None = None) -> ExecResult:
        self.ran.append((action, gpu))
        self.started.set()
        if self.hold is not None:
            await self.hold.wait()
        return ExecResult(self.ok, f"{action} {'ok' if self.ok else 'failed'} on {self.host}")


class Thread:
    """The alert conversations: what the engine announced, per alert key."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str]] = []

    async def announce(self, alert_key: str, text: str) -> None:
        self.messages.append((alert_key, text))

    def texts(self, alert_key: str | None = None) -> list[str]:
        return [text for key, text in self.messages if alert_key is None or key == alert_key]


def remediation_config(hosts: Sequence[str], **settings: Any) -> RemediationConfig:
    return RemediationConfig.model_validate({"hosts": {host: {} for host in hosts}, **settings})


def engine(
    store: Store,
    config: RemediationConfig,
    executors: dict[str, RecordingExecutor],
    clock: FakeClock,
    thread: Thread | None = None,
    metrics: Metrics | None = None,
) -> Remediation:
    per_host: dict[str, dict[str, Executor]] = {
        host: dict.fromkeys(executor.actions(), executor) for host, executor in executors.items()
    }
    return Remediation(
        store,
        config,
        per_host,
        thread or Thread(),
        ConfigAuthorizer(config),
        alert_finder(store),
        clock=clock,
        metrics=metrics,
    )


async def firing_alert(store: SqliteStore, alertname: str = "DCGMExporterNoGPUs", **labels: str) -> AlertState:
    alert = am_alert(alertname, **labels)
    await ingest_and_dedup(store, webhook([alert], group_key=f"{{}}:{{{alert['fingerprint']}}}"))
    found = [a for a in await store.list_alerts("firing", 10000) if a.fingerprint == alert["fingerprint"]]
    assert len(found) == 1
    return found[0]

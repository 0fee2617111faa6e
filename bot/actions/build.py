"""The remediation engine as the configuration describes it: executors per host, approvers, verification."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial

from bot.actions.authorization import ConfigAuthorizer
from bot.actions.conversation import Announcer
from bot.actions.engine import AlertFinder, Authorizer, Remediation, Verification
from bot.actions.executor import Executor
from bot.actions.fleet import FleetRemediation, latest_view, members_from_views
from bot.actions.policy import AutomaticPolicy
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, RemediationConfig
from bot.metrics import Metrics
from bot.models import AlertState
from bot.playbooks import PlaybookSet
from bot.storage.interface import Store, StoreUnavailable

log = logging.getLogger(__name__)


def build_executors(config: RemediationConfig, clock: Clock = SYSTEM_CLOCK) -> dict[str, dict[str, Executor]]:
    """Per configured host, per action, the executor that runs it there: the first configured of Docker
    (the most direct), Kubernetes, Slurm (the scheduler's node actions, read back on `clock`), then SSH.

    Each executor's client library is imported only when some host uses it: together they take seconds to
    load, which every command and every start of the bot would pay otherwise."""
    executors: dict[str, dict[str, Executor]] = {}
    for host, target in config.hosts.items():
        candidates: list[Executor] = []
        if target.docker is not None:
            from bot.actions.docker import DockerExecutor

            candidates.append(DockerExecutor(host, target.docker))
        if config.kubernetes is not None and target.kubernetes_node is not None:
            from bot.actions.kubernetes import KubernetesExecutor

            candidates.append(KubernetesExecutor(host, target.kubernetes_node, config.kubernetes))
        if config.slurm is not None and target.slurm_node is not None:
            from bot.actions.slurm import SlurmExecutor

            candidates.append(SlurmExecutor(host, target.slurm_node, config.slurm, clock))
        if target.ssh is not None:
            from bot.actions.ssh import SshExecutor

            candidates.append(SshExecutor(host, target.ssh))
        executors[host] = _first_per_action(candidates)
    return executors


def _first_per_action(candidates: list[Executor]) -> dict[str, Executor]:
    chosen: dict[str, Executor] = {}
    for executor in candidates:
        for action in sorted(executor.actions()):
            chosen.setdefault(action, executor)
    return chosen


def alert_finder(store: Store) -> AlertFinder:
    """Alerts by the short id people see in messages, by key, or by fingerprint (the firing episode)."""

    async def find(alert_id: str) -> AlertState | None:
        alert = await store.alert_by_short_id(alert_id) or await store.get_alert(alert_id)
        if alert is not None:
            return alert
        firing = await store.list_alerts("firing", limit=10000)
        return next((candidate for candidate in firing if candidate.fingerprint == alert_id), None)

    return find


class NoteAnnouncer:
    """Announcements as notes of the alert: delivered through the outbox into its thread (Slack, email)."""

    def __init__(self, store: Store, notify: Callable[[], None]) -> None:
        self._store = store
        self._notify = notify

    async def announce(self, alert_key: str, text: str) -> None:
        await self._store.add_note(alert_key, text)
        self._notify()


@dataclass
class RemediationService:
    """The engine, and its background duty every poll_interval: expire unapproved requests, apply the
    automatic policy."""

    engine: Remediation
    policy: AutomaticPolicy
    clock: Clock
    poll_interval: float
    # Lines for `/gpu status`: the state of the nodes a scheduler executor serves.
    status: Callable[[], Awaitable[list[str]]]
    # An incident's fleet actions (its card's buttons), run by the engine once approved.
    fleet: FleetRemediation
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.engine.resume()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.engine.close()

    async def _loop(self) -> None:
        while True:
            try:
                await self.engine.expire_stale()
                if self.policy.enabled():
                    await self.policy.check()
            except StoreUnavailable as exc:
                log.warning("remediation could not use the store", extra={"error": str(exc)})
            await self.clock.sleep(self.poll_interval)


def build_remediation(
    config: BotConfig,
    store: Store,
    notify: Callable[[], None],
    metrics: Metrics,
    playbooks: PlaybookSet,
    clock: Clock = SYSTEM_CLOCK,
    authorizer: Callable[[Authorizer], Authorizer] | None = None,
    announcer: Callable[[Announcer], Announcer] | None = None,
) -> RemediationService:
    """`authorizer` wraps the configured approvers (`remediation.approvers`, `admins`): Slack's roles. `announcer`
    wraps the notes in the alert's conversation: Slack's incident threads."""
    remediation = config.remediation
    prometheus = remediation.prometheus or config.enrichment.prometheus
    verifiers: dict[str, Verification] = {}
    if prometheus is not None:
        # Imported here: its Prometheus client loads the enrichers, which a bot without a verification source
        # (or an ingest process with no remediation) never uses.
        from bot.actions.verify import ExporterRestartCheck

        verifiers["restart-dcgm-exporter"] = ExporterRestartCheck(prometheus, clock, remediation.poll_interval)
    executors = build_executors(remediation, clock)
    notes: Announcer = NoteAnnouncer(store, notify)
    talk = announcer(notes) if announcer else notes
    engine = Remediation(
        store,
        remediation,
        executors,
        talk,
        authorizer(ConfigAuthorizer(remediation)) if authorizer else ConfigAuthorizer(remediation),
        alert_finder(store),
        verifiers,
        clock,
        metrics,
        lambda alert: " ".join(playbooks.match(alert).escalate.split()),
    )
    fleet = FleetRemediation(
        store, remediation, engine, members_from_views(store, latest_view(store)), talk, clock, metrics
    )
    policy = AutomaticPolicy(engine, store, clock)
    return RemediationService(engine, policy, clock, remediation.poll_interval, partial(node_status, executors), fleet)


async def node_status(executors: dict[str, dict[str, Executor]]) -> list[str]:
    """The scheduler's word on the configured Slurm nodes; nothing when no host has a Slurm executor."""
    if not any(executor.kind == "slurm" for per_host in executors.values() for executor in per_host.values()):
        return []
    from bot.actions.slurm import scheduler_status

    return await scheduler_status(executors)

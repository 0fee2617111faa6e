"""The remediation engine as the configuration describes it: executors per host, approvers, verification."""

from __future__ import annotations

from bot.actions.docker import DockerExecutor
from bot.actions.engine import AlertFinder
from bot.actions.executor import Executor
from bot.actions.kubernetes import KubernetesExecutor
from bot.actions.ssh import SshExecutor
from bot.config import RemediationConfig
from bot.models import AlertState
from bot.store.base import Store


def build_executors(config: RemediationConfig) -> dict[str, dict[str, Executor]]:
    """Per configured host, per action, the executor that runs it there: the first configured of Docker
    (the most direct), Kubernetes, then SSH."""
    executors: dict[str, dict[str, Executor]] = {}
    for host, target in config.hosts.items():
        candidates: list[Executor] = []
        if target.docker is not None:
            candidates.append(DockerExecutor(host, target.docker))
        if config.kubernetes is not None and target.kubernetes_node is not None:
            candidates.append(KubernetesExecutor(host, target.kubernetes_node, config.kubernetes))
        if target.ssh is not None:
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
    """Alerts by key or fingerprint (the firing episode)."""

    async def find(alert_id: str) -> AlertState | None:
        alert = await store.get_alert(alert_id)
        if alert is not None:
            return alert
        firing = await store.list_alerts("firing", limit=10000)
        return next((candidate for candidate in firing if candidate.fingerprint == alert_id), None)

    return find

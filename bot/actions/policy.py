"""The automatic policy (opt-in per action, off by default): restart dcgm-exporter by itself when it is up but
reports no GPU (DCGMExporterNoGPUs) or its Xid gauge is stuck: the DCGMXidGaugeStuck rule, or the enrichment's
stale-gauge verdict on an Xid alert (no kernel line for that GPU). Each alert episode is tried once; the engine's
rails still apply (cooldown, circuit breaker, verification, announcements)."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from bot.actions.engine import Remediation
from bot.actions.runs import AUTOMATIC_ACTOR, ActionRefused
from bot.clock import Clock
from bot.evidence import Enrichment
from bot.models import AlertState
from bot.storage.interface import Store
from bot.verdict import STALE_XID_GAUGE, verdicts_of

# alertname -> the action that fixes what it reports
AUTOMATIC_TRIGGERS = {"DCGMExporterNoGPUs": "restart-dcgm-exporter", "DCGMXidGaugeStuck": "restart-dcgm-exporter"}
# What restarting the exporter fixes when the enrichment finds an alert's Xid gauge stale.
STALE_GAUGE_ACTION = "restart-dcgm-exporter"


def stale_xid_gauge(alert: AlertState) -> bool:
    """The enrichment of this alert episode judged its Xid gauge stale (held since before, no kernel line)."""
    if alert.enrichment is None:
        return False
    return any(v.name == STALE_XID_GAUGE for v in verdicts_of(Enrichment.model_validate(alert.enrichment)))


def automatic_action(alert: AlertState) -> str | None:
    """The action the automatic policy would take for this firing alert, if any."""
    action = AUTOMATIC_TRIGGERS.get(alert.labels.get("alertname", ""))
    if action is None and stale_xid_gauge(alert):
        return STALE_GAUGE_ACTION
    return action


class AutomaticPolicy:
    def __init__(self, engine: Remediation, store: Store, clock: Clock) -> None:
        self._engine = engine
        self._store = store
        self._clock = clock
        self._tried: set[str] = set()  # alert keys asked for in this process (refusals leave no run)

    def enabled(self) -> bool:
        return any(self._engine.policy(action).automatic for action in set(AUTOMATIC_TRIGGERS.values()))

    async def check(self) -> None:
        """Ask once for the action of every firing trigger alert that has none yet."""
        executable = self._engine.executable_actions()
        for alert in await self._store.list_alerts("firing", limit=10000):
            action = automatic_action(alert)
            if action is None or action not in executable or not self._engine.policy(action).automatic:
                continue
            if alert.key in self._tried or await self._has_run(alert.key, action):
                continue
            self._tried.add(alert.key)
            with contextlib.suppress(ActionRefused):  # a refusal is audited and told in the thread
                await self._engine.request(action, alert.key, AUTOMATIC_ACTOR, automatic=True)

    async def _has_run(self, alert_key: str, action: str) -> bool:
        runs = await self._store.action_runs(self._clock.now() - timedelta(days=1))
        return any(run.alert_key == alert_key and run.action == action for run in runs)

"""The incident stage's evidence: the incident-level analysis (bot/incident/analysis.py) asked of the configured
Prometheus for one incident, from what the store keeps of it. Without Prometheus there is nothing to ask: an
incident is then told with its scope and hosts only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.config import PrometheusConfig
from bot.enrich.prometheus.client import PrometheusClient
from bot.incident.analysis import AffectedAlert, AnalysisRequest, analyse_incident
from bot.models import AlertState, host_from_labels
from bot.playbooks import Playbook
from bot.store.incidents import IncidentRecord


class IncidentAnalyser:
    def __init__(self, config: PrometheusConfig, variables: Mapping[str, str]) -> None:
        self._client = PrometheusClient(config)
        self._variables = dict(variables)

    async def analyse(self, record: IncidentRecord, playbook: Playbook, firing: Sequence[AlertState]) -> dict[str, Any]:
        """Traits, signals, companions, the likely cause and the fleet's size, as JSON for the store."""
        summary = record.summary
        request = AnalysisRequest(
            alertname=record.alertname,
            section=playbook.incident,
            alerts=[AffectedAlert(host=host, instance=instance) for host, instance in sorted(summary.targets)],
            start=summary.since or record.opened_at,
            api=self._client,
            # The incident's own alerts are left out by their name (`companions`).
            firing=[
                (a.labels.get("alertname", ""), host_from_labels(a.labels)) for a in firing if a.status == "firing"
            ],
            variables=self._variables,
        )
        return (await analyse_incident(request)).model_dump(mode="json")

    async def close(self) -> None:
        await self._client.close()

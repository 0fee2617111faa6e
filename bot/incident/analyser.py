"""The incident stage's evidence: the incident-level analysis (bot/incident/analysis.py) asked of Prometheus for one
incident, from what the store keeps of it. With a Prometheus per site (`enrichment.prometheus.sites`), it asks the
sources of the sites its alerts come from, each once, and compares the affected hosts with all of their fleets.
Without Prometheus there is nothing to ask: an incident is then told with its scope and hosts only."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from bot.config import BotConfig, PrometheusConfig, SiteMatch
from bot.enrich.prometheus.client import PrometheusClient, RawSeries
from bot.enrich.queryapi import Deadline
from bot.enrich.sites import site_matches
from bot.incident.analysis import AffectedAlert, AnalysisRequest, analyse_incident
from bot.incident.model import Companion
from bot.incident.record import IncidentRecord, Origin
from bot.incident.view import upstream_order
from bot.models import AlertState, host_from_labels
from bot.playbooks.incident import IncidentSection


class Sources:
    """Several sources asked one question together, their answers put together (each site's hosts are series of
    their own). One that fails fails the question: a fleet that lacks a site would make its hosts look alike."""

    def __init__(self, clients: Sequence[PrometheusClient]) -> None:
        self.clients = list(clients)

    async def query(self, query: str, at: float | None, deadline: Deadline) -> list[RawSeries]:
        answers = await asyncio.gather(*(client.query(query, at, deadline) for client in self.clients))
        return [series for answer in answers for series in answer]

    async def query_range(
        self, query: str, start: float, end: float, step: float, deadline: Deadline
    ) -> list[RawSeries]:
        calls = (client.query_range(query, start, end, step, deadline) for client in self.clients)
        return [series for answer in await asyncio.gather(*calls) for series in answer]


class IncidentAnalyser:
    def __init__(self, config: PrometheusConfig, variables: Mapping[str, str]) -> None:
        self._default = PrometheusClient(config)
        self._sites: list[tuple[SiteMatch, str, PrometheusClient]] = [
            (site.match, site.name, PrometheusClient(site, name=site.name)) for site in config.sites
        ]
        self._variables = dict(variables)

    @property
    def per_site(self) -> bool:
        """Whether sources are per site: `analyse` then needs the incident's origins."""
        return bool(self._sites)

    @property
    def site_labels(self) -> list[str]:
        """The labels a site is picked by: what the store is asked of the incident's alerts (`analyse`'s origins)."""
        return sorted({name for match, _, _ in self._sites for name in match.labels})

    async def analyse(
        self,
        record: IncidentRecord,
        sections: Sequence[IncidentSection | None],
        firing: Sequence[AlertState],
        origins: Sequence[Origin] = (),
    ) -> dict[str, Any]:
        """Traits, signals, companions, the likely cause and the fleet's size, as JSON for the store. `sections`:
        the incident section of each of its alertnames' playbooks, in the order of `upstream_order`; `origins`: where
        its alerts come from (`Store.incident_origins` of `site_labels`), when sources are per site."""
        summary = record.summary
        alertnames = upstream_order(summary.names) or [record.alertname]
        picked = self._picked(origins)
        api = Sources([client for _, client in picked]) if self._sites else self._default
        request = AnalysisRequest(
            alertnames=alertnames,
            sections=sections,
            alerts=[AffectedAlert(host=host, instance=instance) for host, instance in sorted(summary.targets)],
            start=summary.since or record.opened_at,
            api=api,
            # The incident's own alerts are left out by their names (`companions`).
            firing=[
                (a.labels.get("alertname", ""), host_from_labels(a.labels)) for a in firing if a.status == "firing"
            ],
            members=[Companion(alertname=name, hosts=summary.hosts_of(name)) for name in alertnames],
            variables=self._variables,
            sources=len(picked),
        )
        found = (await analyse_incident(request)).model_dump(mode="json")
        return {**found, "sites": sorted(name for name, _ in picked if name)}

    def _picked(self, origins: Sequence[Origin]) -> list[tuple[str, PrometheusClient]]:
        """The default source without sites; else the source of each site an alert comes from (the default, which
        names no site, for an alert no site picks), each once, with its site's name."""
        if not self._sites:
            return [("", self._default)]
        picked: dict[int, tuple[str, PrometheusClient]] = {}
        for labels, generator_url in origins:
            site = next((s for s in self._sites if site_matches(s[0], labels, generator_url)), None)
            name, client = (site[1], site[2]) if site is not None else ("", self._default)
            picked[id(client)] = (name, client)
        return list(picked.values()) or [("", self._default)]

    async def close(self) -> None:
        await self._default.close()
        for _, _, client in self._sites:
            await client.close()


def incident_analyser(config: BotConfig) -> IncidentAnalyser | None:
    """The analyser of the bot's incidents: none without `enrichment.prometheus` (nothing to ask)."""
    prometheus = config.enrichment.prometheus
    return IncidentAnalyser(prometheus, config.playbooks.vars) if prometheus is not None else None

"""Sources per site: an alert is enriched from its own site's Prometheus and Loki, not from one global source.

A site's source is picked by the alert's labels (Alertmanager passes on each Prometheus' external labels, such as
`site` or `cluster`) or by the host of its generatorURL, the first site that matches; other alerts go to the
default source. `Sited` runs one enricher per source, each over its own part of the batch, so a batch's queries
are planned per source first and one site's alerts never share a query with another's.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bot.config import SiteMatch
from bot.enrich.base import Enricher, EnrichmentRequest
from bot.evidence import EnrichmentSection
from bot.models import AlertState


def site_matches(match: SiteMatch, labels: Mapping[str, str], generator_url: str) -> bool:
    """Whether an alert with these labels and generatorURL is the site's."""
    if match.labels and all(labels.get(name) == value for name, value in match.labels.items()):
        return True
    if not match.generator_hosts or not generator_url:
        return False
    try:
        location = urllib.parse.urlsplit(generator_url)
        host = location.hostname or ""
    except ValueError:  # a generatorURL is the sender's text: a malformed one matches no site
        return False
    return location.netloc in match.generator_hosts or host in match.generator_hosts


@dataclass(frozen=True)
class Site:
    name: str
    match: SiteMatch
    enricher: Enricher


class Sited:
    """One enricher per source: the site's whose `match` the alert meets first, else the default's."""

    def __init__(self, default: Enricher, sites: Sequence[Site]) -> None:
        self.name = default.name
        self.title = default.title
        # Each section names its own source and its site (set in `enrich`); a remote source all the same, which
        # an alert told as a line of an incident is not enriched from.
        self.source = default.source
        self._default = default
        self._sites = list(sites)

    def site_of(self, alert: AlertState) -> Site | None:
        return next((s for s in self._sites if site_matches(s.match, alert.labels, alert.generator_url)), None)

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        site = self.site_of(request.alert)
        name = site.name if site is not None else ""
        enricher = site.enricher if site is not None else self._default
        batch = request.batch.part(f"{self.name}@{name}", lambda alert: self._site_name(alert) == name)
        section = await enricher.enrich(request.within(batch))
        if site is None:
            return section.model_copy(update={"source": enricher.source})
        return section.model_copy(update={"source": f"{enricher.source} ({name})", "site": name})

    def _site_name(self, alert: AlertState) -> str:
        site = self.site_of(alert)
        return site.name if site is not None else ""

    async def close(self) -> None:
        await self._default.close()
        for site in self._sites:
            await site.enricher.close()

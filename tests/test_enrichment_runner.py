"""The enrichment runner: one budget for every enricher of an alert; what is late or broken says so."""

from __future__ import annotations

import asyncio

from bot.enrich.base import EnrichmentRequest, EnrichmentRunner
from bot.evidence import EnrichmentSection
from bot.metrics import Metrics
from tests.support.payloads import alert_state


class _Hangs:
    name, title, source = "hangs", "Hangs", "Nowhere"

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        await asyncio.Event().wait()
        raise AssertionError("never answers")

    async def close(self) -> None:
        return None


async def test_an_enricher_past_the_budget_is_unavailable_and_nothing_waits_for_it() -> None:
    runner = EnrichmentRunner([_Hangs()], 0.2, Metrics())
    alert = alert_state({"alertname": "GPUXidError", "Hostname": "k-ai-01"})
    enrichment = await asyncio.wait_for(runner.run(alert, None), timeout=5)
    [section] = enrichment.sections
    assert section.status == "unavailable" and "0.2 s enrichment budget" in section.reason


class _Breaks:
    name, title, source = "breaks", "Breaks", "Somewhere"

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        raise RuntimeError("the exporter answered nonsense")

    async def close(self) -> None:
        return None


async def test_an_enricher_that_raises_says_what_went_wrong_and_the_others_still_answer() -> None:
    runner = EnrichmentRunner([_Breaks(), _Hangs()], 0.2, Metrics())
    enrichment = await runner.run(alert_state({"alertname": "GPUXidError"}), None)
    broken, late = enrichment.sections
    assert (broken.status, broken.reason) == ("unavailable", "the exporter answered nonsense")
    assert broken.source == "Somewhere" and late.status == "unavailable"

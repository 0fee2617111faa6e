"""Typed evidence: each enricher's output is a model, read back from the store's JSON by the section's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.evidence import (
    Enrichment,
    EnrichmentSection,
    GpuEvidence,
    LokiEvidence,
    PrometheusEvidence,
    RecurrenceEvidence,
    RelatedEvidence,
    XidEvidence,
)
from bot.evidence.sites import sites_text
from bot.verdict import STALE_XID_GAUGE, verdicts_of

# Enrichment as the store held it before the sections carried models (keys written by hand from that code).
STORED = Path(__file__).parent / "fixtures" / "enrichment_before_typed_evidence.json"


def stored() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(STORED.read_text(encoding="utf-8"))
    return loaded


def test_enrichment_stored_before_the_models_reads_back_typed() -> None:
    enrichment = Enrichment.model_validate(stored())
    gpu = enrichment.evidence(GpuEvidence)
    xid = enrichment.evidence(XidEvidence)
    recurrence = enrichment.evidence(RecurrenceEvidence)
    prometheus = enrichment.evidence(PrometheusEvidence)
    related = enrichment.evidence(RelatedEvidence)
    loki = enrichment.evidence(LokiEvidence)
    assert gpu is not None and (gpu.uuid, gpu.serial) == ("GPU-3b000000-0000-0000-0000-000000000000", "1650423013443")
    assert xid is not None and xid.events[0].xid == 79 and xid.stale_gauge is True
    assert [v.name for v in verdicts_of(enrichment)] == [STALE_XID_GAUGE]
    assert recurrence is not None and recurrence.escalate is False
    assert prometheus is not None and prometheus.related["gpu_temp"].current == 61.0
    assert prometheus.history is not None and prometheus.history.changes == 0
    assert related is not None and related.root == "PSUVoltageDrop@k-ai-01"
    assert related.alerts[0].offset_seconds == -240.0
    assert loki is not None and loki.entries[0][1].startswith("NVRM: Xid")
    assert enrichment.get("slow") == EnrichmentSection.unavailable("slow", "Slow", "no answer")


def test_the_stored_json_keeps_its_shape() -> None:
    """What the pipeline stores (`model_dump(mode="json")`) is what it stored before, so both read alike; a section
    stored before sections named their site and replica has neither."""
    before = stored()
    after = Enrichment.model_validate(before).model_dump(mode="json")
    for old, new in zip(before["sections"], after["sections"], strict=True):
        assert new == {**old, "data": old["data"] or None, "site": "", "replica": ""}


def test_a_misspelt_field_in_stored_evidence_is_refused_not_dropped() -> None:
    broken = stored()
    broken["sections"][1]["data"]["stale_guage"] = True
    with pytest.raises(ValidationError, match="stale_guage"):
        Enrichment.model_validate(broken)


def test_a_section_holds_only_the_evidence_of_its_own_enricher() -> None:
    with pytest.raises(ValidationError, match="'xid' section holds 'gpu' evidence"):
        EnrichmentSection(name="xid", title="Xid", status="ok", data=GpuEvidence(index="3"))
    with pytest.raises(ValidationError, match="no evidence model for a section named 'mystery'"):
        EnrichmentSection.model_validate({"name": "mystery", "title": "?", "status": "ok", "data": {"x": 1}})


def test_evidence_of_a_section_that_did_not_answer_is_none() -> None:
    section = EnrichmentSection(name="gpu", title="GPU", status="ok", data=GpuEvidence(index="3"))
    assert Enrichment(sections=[section]).evidence(GpuEvidence) == GpuEvidence(index="3")
    skipped = section.model_copy(update={"status": "skipped"})
    assert Enrichment(sections=[skipped]).evidence(GpuEvidence) is None
    assert Enrichment().evidence(XidEvidence) is None


@pytest.mark.parametrize(
    ("section", "heading"),
    [
        (EnrichmentSection(name="prometheus", title="Metric history", status="ok", source="Prometheus"),
         "Metric history"),
        (EnrichmentSection(name="prometheus", title="Metric history", status="ok", source="Prometheus (b)", site="b"),
         "Metric history · Prometheus (b)"),
        (EnrichmentSection(name="loki", title="Kernel log (Loki)", status="ok", source="Loki (b)", site="b"),
         "Kernel log · Loki (b)"),
        (EnrichmentSection(name="prometheus", title="Metric history", status="unavailable", source="Prometheus (a)",
                           site="a", replica="prom-a2.example:9090"),
         "Metric history · Prometheus (a), answered by prom-a2.example:9090"),
        (EnrichmentSection(name="prometheus", title="Metric history", status="ok", source="Prometheus",
                           replica="prom2:9090"),
         "Metric history · Prometheus, answered by prom2:9090"),
    ],
)  # fmt: skip
def test_a_sections_heading_names_its_site_and_the_replica_that_answered(
    section: EnrichmentSection, heading: str
) -> None:
    assert section.heading == heading


def test_sites_are_named_once_each_in_order() -> None:
    assert sites_text([]) == sites_text([""]) == ""
    assert sites_text(["a"]) == "site a"
    assert sites_text(["b", "a", "b"]) == "sites a and b"
    assert sites_text(["c", "a", "", "b"]) == "sites a, b and c"

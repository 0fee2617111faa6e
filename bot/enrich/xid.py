"""The `xid` enricher: what the driver said about this alert's GPU, decoded with the Xid catalog.

It parses the `loki` section's kernel lines, keeps the Xids of the alert's GPU (every GPU of the host for a
host-level alert), decodes them (catalog advice, the Xid 154 recovery action overriding it, Xid 45 pointing
at its cause, the set bits of an Xid 74 line's registers), decodes the alert's own `err_code`/`xid` label,
and judges whether the alert may come from a stale `DCGM_FI_DEV_XID_ERRORS` gauge (it keeps its last value
until the exporter restarts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from bot.enrich.base import EnrichmentRequest
from bot.enrich.gpu import GpuIdentity, from_kernel, kernel_report, resolve_identity
from bot.evidence import (
    DecodedXidRecord,
    EnrichmentSection,
    LokiEvidence,
    PrometheusEvidence,
    PrometheusSeries,
    Verdict,
    XidCatalogEntry,
    XidEvidence,
    XidWorst,
    evidence_of,
)
from bot.gpu.nvrm import XidEvent
from bot.gpu.xid_catalog import DecodedXid, XidCatalog, XidEntry, decode_events, severity_rank, worst
from bot.models import AlertState
from bot.verdict import STALE_XID_GAUGE, XID_GAUGE_UNJUDGED

XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"
GAUGE_QUERY_NAME = "xid_gauge"
STALE_GAUGE_TEXT = (
    "Probable stale Xid gauge: DCGM_FI_DEV_XID_ERRORS keeps its last value until the exporter restarts; "
    "no NVRM Xid line for this GPU in the window"
)
STALE_GAUGE_HEADLINE = "probably a stale gauge, no Xid in the kernel log"
# At most this many decoded events are kept in the section (the most severe); the message shows fewer.
# How long before the alert's start a gauge series must already show its value to be suspected stale: more than
# GPUXIDError's own 5 min lookback for a new series, plus a scrape and an evaluation.
NEW_SERIES_MARGIN = timedelta(minutes=10)
MAX_EVENTS_KEPT = 50
MAX_EVENTS_SHOWN = 8
# Decode lines (Xid 74 register bits, NVLink5 unit and link) shown under each event; the section keeps them all.
MAX_DETAILS_SHOWN = 3

_PLAIN_GAUGE_EXPR = re.compile(rf"^\s*{XID_GAUGE}\s*(?:\{{[^}}]*\}})?\s*(?:(?:[<>]=?|[!=]=)\s*[0-9.eE+-]+)?\s*$")
_ALERT_XID_LABELS = ("err_code", "xid")


class XidEnricher:
    name = "xid"
    title = "Kernel Xid"
    source = ""

    def __init__(self, catalog: XidCatalog) -> None:
        self._catalog = catalog

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        alert = request.alert
        identity = await resolve_identity(request)
        loki = await request.section("loki")
        prometheus = evidence_of(await request.section("prometheus"), PrometheusEvidence)
        report = kernel_report(loki)
        if report is not None:
            identity, _ = from_kernel(identity, report)
        # Kernel lines name a GPU by PCI address only (a UUID helps once a `GPU at` line maps it).
        scope = "gpu" if identity.pci is not None else "host"
        decoded = decode_events(report.events, self._catalog) if report is not None else []
        mine = [item for item in decoded if scope == "host" or _on_gpu(item.event, identity)]
        alert_xid, alert_xid_source, alert_xid_label = _alert_xid(alert.labels, prometheus)
        if not mine and alert_xid is None and not _about_xid(alert, prometheus):
            reason = "no NVRM Xid line in the window" if report is not None else "no kernel log and no Xid label"
            return EnrichmentSection.skipped(self.name, self.title, reason)
        stale, stale_note = _stale_gauge(prometheus, loki, mine, alert.starts_at)
        kept = _most_severe(mine, MAX_EVENTS_KEPT)
        return EnrichmentSection(
            name=self.name,
            title=self.title,
            status="ok",
            summary=self._summary(mine, alert_xid, alert_xid_source, stale, have_log=report is not None),
            lines=self._lines(mine, alert_xid, identity, scope, loki, stale_note),
            data=XidEvidence(
                scope=scope,
                gpu=identity.to_data(),
                alert_xid=alert_xid,
                alert_xid_source=alert_xid_source,
                alert_xid_label=alert_xid_label,
                events=[DecodedXidRecord.model_validate(item.to_dict()) for item in kept],
                events_total=len(mine),
                catalog=self._catalog_entries({item.event.xid for item in mine} | _codes(alert_xid)),
                worst=_worst_data(mine),
                stale_gauge=stale,
                stale_reason=stale_note,
                verdict=_verdict(stale, stale_note, loki),
                kernel_log=_kernel_log_state(loki),
                gpus={} if report is None else {pci.bus_id: uuid for pci, uuid in report.uuids.items()},
                truncated=_truncated(loki),
            ),
        )

    def _summary(
        self, mine: list[DecodedXid], alert_xid: int | None, source: str | None, stale: bool | None, have_log: bool
    ) -> str:
        if stale:
            return STALE_GAUGE_TEXT
        top = worst(mine)
        if top is not None:
            return f"Xid {top.event.xid} {top.entry.title} ({top.severity}): {top.action}"
        if alert_xid is not None:
            entry = self._catalog.entry(alert_xid)
            return f"Xid {alert_xid} {entry.title} ({entry.severity}, from {source}): {entry.action}"
        if not have_log:
            return "Which Xid is unknown: no kernel log to read and no Xid code in the alert's labels"
        return "No NVRM Xid line for this GPU in the window"

    def _lines(
        self,
        mine: list[DecodedXid],
        alert_xid: int | None,
        identity: GpuIdentity,
        scope: str,
        loki: EnrichmentSection | None,
        stale_note: str,
    ) -> list[str]:
        lines: list[str] = []
        if stale_note and stale_note != STALE_GAUGE_TEXT:
            lines.append(stale_note)
        if loki is None:
            lines.append("Kernel log not configured (enrichment.loki): decoded from the alert's labels only")
        elif loki.status != "ok":
            lines.append(f"Kernel log unavailable ({loki.reason or loki.status}): decoded from the alert's labels only")
        elif alert_xid is not None and not any(item.event.xid == alert_xid for item in mine):
            entry = self._catalog.entry(alert_xid)
            lines.append(f"The alert's Xid {alert_xid} ({entry.title}) has no NVRM line for this GPU in the window")
        if scope == "host" and identity.is_gpu and mine:
            lines.append("The alert's GPU has no known PCI address to match kernel lines: every GPU's Xids shown")
        for item in _most_severe(mine, MAX_EVENTS_SHOWN):
            lines.append(_event_line(item))
            lines.append(f"  -> {item.action}")
            lines.extend(_detail_lines(item.details))
        if len(mine) > MAX_EVENTS_SHOWN:
            lines.append(f"... and {len(mine) - MAX_EVENTS_SHOWN} more Xid events")
        return lines

    def _catalog_entries(self, codes: set[int]) -> dict[str, XidCatalogEntry]:
        return {str(code): _catalog_entry(self._catalog.entry(code)) for code in sorted(codes)}

    async def close(self) -> None:
        return None


def _catalog_entry(entry: XidEntry) -> XidCatalogEntry:
    return XidCatalogEntry(
        name=entry.name,
        title=entry.title,
        severity=entry.severity,
        action=entry.action,
        follow_up=entry.follow_up,
        causes=list(entry.causes),
        nvidia=entry.nvidia.model_dump(),
        known=entry.known,
    )


def _on_gpu(event: XidEvent, identity: GpuIdentity) -> bool:
    """Whether an event is about this GPU; a bus drop that names no GPU may be about any of them."""
    return event.pci is None or event.pci == identity.pci


def _alert_xid(
    labels: Mapping[str, str], prometheus: PrometheusEvidence | None
) -> tuple[int | None, str | None, str | None]:
    """The Xid the alert is about, in words where it came from, and the label that gave it: dcgm-exporter's
    `err_code` (DCGM_FI_DEV_XID_ERRORS) or `xid` (DCGM_EXP_XID_ERRORS_COUNT) label, else the gauge's value
    (the last Xid code)."""
    for label in _ALERT_XID_LABELS:
        value = labels.get(label, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), f"the alert's {label} label", label
    series = _gauge_series(prometheus)
    current = None if series is None else series.current
    if current is not None and current > 0 and current.is_integer():
        return int(current), f"the {XID_GAUGE} value", None
    return None, None, None


def _codes(xid: int | None) -> set[int]:
    return set() if xid is None else {xid}


def _about_xid(alert: AlertState, prometheus: PrometheusEvidence | None) -> bool:
    expr = prometheus.expr if prometheus is not None else None
    return "XID" in alert.alertname.upper() or (expr is not None and "XID" in expr.upper())


def _gauge_series(prometheus: PrometheusEvidence | None) -> PrometheusSeries | None:
    """The DCGM_FI_DEV_XID_ERRORS series: the playbook's `xid_gauge` query, or the alert's own history when
    its expression is that gauge itself (optionally compared to a number)."""
    if prometheus is None:
        return None
    series = prometheus.related.get(GAUGE_QUERY_NAME)
    if series is not None:
        return series
    expr, history = prometheus.expr, prometheus.history
    if expr is not None and _PLAIN_GAUGE_EXPR.match(expr) and history is not None:
        return history
    return None


def _stale_gauge(
    prometheus: PrometheusEvidence | None,
    loki: EnrichmentSection | None,
    mine: Sequence[DecodedXid],
    alert_start: datetime,
) -> tuple[bool | None, str]:
    """(stale?, what to say). None when it cannot be judged: no gauge series, or no (complete) kernel log."""
    series = _gauge_series(prometheus)
    if series is None:
        return None, ""
    if not _held_since_before(series, alert_start):
        return False, ""
    why = _kernel_log_gap(loki)
    if why:
        return None, (
            f"{XID_GAUGE} has not changed over the window; whether it is stale cannot be told without the "
            f"kernel log ({why})"
        )
    if mine:
        return False, ""
    return True, STALE_GAUGE_TEXT


def _kernel_log_gap(loki: EnrichmentSection | None) -> str:
    """Why the kernel log cannot show that no Xid happened, or "" when it can."""
    if loki is None:
        return "not configured"
    if loki.status != "ok":
        return loki.reason or loki.status
    return "Loki's answer was cut at its line limit" if _truncated(loki) else ""


def _truncated(loki: EnrichmentSection | None) -> bool:
    found = evidence_of(loki, LokiEvidence)
    return found is not None and found.truncated


def _verdict(stale: bool | None, stale_note: str, loki: EnrichmentSection | None) -> Verdict | None:
    """The stale-gauge judgement as a verdict: stale, or held but not judgeable (the note says why)."""
    if stale:
        return Verdict(name=STALE_XID_GAUGE, headline=STALE_GAUGE_HEADLINE, line=STALE_GAUGE_TEXT)
    if stale is None and stale_note:
        gap = "kernel log cut at Loki's line limit" if loki is not None and loki.status == "ok" else "no kernel log"
        headline = f"Xid gauge unchanged since before the alert, stale or fresh cannot be told ({gap})"
        return Verdict(name=XID_GAUGE_UNJUDGED, headline=headline, line=stale_note)
    return None


def _held_since_before(series: PrometheusSeries, alert_start: datetime) -> bool:
    """The gauge shows one non-zero value, unchanged since well before the alert started.

    dcgm-exporter 3.3.6+ puts the code in an `err_code` label: a new Xid is a new series whose values never
    change, so "unchanged" alone would call every new Xid stale. A stale value was there before the alert.
    """
    values, current = series.values, series.current
    if len(values) < 2 or series.changes != 0 or current is None or current <= 0:
        return False
    return values[0][0] <= (alert_start - NEW_SERIES_MARGIN).timestamp()


def _kernel_log_state(loki: EnrichmentSection | None) -> str:
    if loki is None:
        return "not configured"
    if loki.status == "ok":
        return "ok"
    return f"{loki.status}: {loki.reason}"


def _most_severe(decoded: Sequence[DecodedXid], limit: int) -> list[DecodedXid]:
    """Up to `limit` events, the most severe first chosen, shown in log order."""
    if len(decoded) <= limit:
        return list(decoded)
    ranked = sorted(range(len(decoded)), key=lambda i: (-severity_rank(decoded[i].severity), i))[:limit]
    return [decoded[i] for i in sorted(ranked)]


def _worst_data(decoded: Sequence[DecodedXid]) -> XidWorst | None:
    top = worst(decoded)
    if top is None:
        return None
    return XidWorst(xid=top.event.xid, title=top.entry.title, severity=top.severity, action=top.action)


def _detail_lines(details: Sequence[str]) -> list[str]:
    shown = [f"     {detail}" for detail in details[:MAX_DETAILS_SHOWN]]
    if len(details) > MAX_DETAILS_SHOWN:
        shown.append(f"     ... and {len(details) - MAX_DETAILS_SHOWN} more register findings")
    return shown


def _event_line(item: DecodedXid) -> str:
    event = item.event
    when = event.timestamp.strftime("%H:%M:%S") if event.timestamp is not None else event.log_time or ""
    where = event.pci_bus_id or "unknown GPU"
    parts = [f"{when} Xid {event.xid} {item.entry.title} [{item.severity}] on {where}".strip()]
    if event.process or event.pid is not None:
        parts.append(f"{event.process or '?'}" + (f" pid {event.pid}" if event.pid is not None else ""))
    if event.count > 1:
        parts.append(f"{event.count} lines")
    if item.cause_xid is not None:
        parts.append(f"caused by Xid {item.cause_xid}")
    if event.recovery is not None:
        parts.append(f"recovery action {event.recovery.previous_name} -> {event.recovery.name}")
    if event.message and event.message != item.entry.title and event.recovery is None:
        parts.append(event.message)
    return " · ".join(parts)

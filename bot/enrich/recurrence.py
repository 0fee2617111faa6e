"""The `recurrence` enricher: this physical GPU's past, from the bot's own store, and what it implies.

Each alert records its GPU's events (every decoded Xid, the Xid its own `err_code`/`xid` label reports, and
the alert itself) keyed by the physical GPU: the UUID, else host + PCI bus id, else host + gpu index. Kernel
Xids are recorded without the alert's key, so two alerts that saw the same kernel line keep one record. Then it
counts how often this GPU had these Xids and this alert within `enrichment.recurrence_window`, and applies the
catalog's escalation rules ("third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA"), with or
without a kernel log.

An Xid known from an alert's label is recorded once per alert episode, at the alert's start. The kernel line
behind it, when a kernel log shows it, is the same occurrence, and so is the label of another alert on the same
gauge series (DCGMXidGaugeStuck starts with the GPUXIDError it follows): a label's Xid counts only when no
kernel line and no earlier label of that Xid on this GPU lies within `LABEL_XID_MATCH` of it. A label the Xid
enricher judged a stale gauge (no kernel line in the window) is not recorded at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from bot.enrich.base import EnrichmentRequest
from bot.enrich.gpu import GpuIdentity, resolve_identity
from bot.enrich.gpu_history import GpuHistory, ReadOnlyHistory, RecordingHistory, among
from bot.evidence import (
    AlertCount,
    DecodedXidRecord,
    EnrichmentSection,
    EscalationVerdict,
    RecurrenceEvidence,
    RecurrenceGpu,
    XidEvidence,
    evidence_of,
)
from bot.gpu.nvrm import PciAddress
from bot.gpu.xid_catalog import FOLLOWER_XIDS, XidCatalog, severity_rank
from bot.gpu.xid_escalation import Verdict, escalate, incidents, window_text
from bot.metrics import Metrics
from bot.models import AlertState, GpuEvent, GpuHistoryRequest
from bot.selftest_label import is_selftest
from bot.storage.interface import Store

NONFATAL_SUFFIX = ":nonfatal"
# The kernel line behind an alert's Xid label precedes the alert's start by an exporter poll, a scrape and a rule
# evaluation (a minute or two); the margin also absorbs clock skew between the GPU server and Prometheus.
LABEL_XID_MATCH = timedelta(minutes=10)


def xid_code(xid: int, nonfatal: bool = False) -> str:
    """How an Xid is stored: its number, marked when the line said Nonfatal (never counted by escalations)."""
    return f"{xid}{NONFATAL_SUFFIX}" if nonfatal else str(xid)


def parse_xid_code(code: str) -> int | None:
    """The Xid of a stored code that escalations count; None for a Nonfatal line or anything else."""
    return int(code) if code.isdigit() else None


def xid_history(events: Iterable[GpuEvent]) -> list[tuple[int, datetime]]:
    """(Xid, time) of each occurrence escalations count: every kernel line, and each alert label's Xid that
    no kernel line and no earlier label of the same Xid stands for already (see LABEL_XID_MATCH)."""
    xids = [e for e in events if e.kind == "xid"]
    kernel = [e for e in xids if not e.alert_key]
    seen = [(_xid_number(e.code), e.at) for e in kernel]
    from_labels: list[tuple[int, datetime]] = []
    for event in sorted((e for e in xids if e.alert_key), key=lambda e: e.at):
        xid = parse_xid_code(event.code)
        if xid is not None and not any(
            code == xid and abs(at - event.at) <= LABEL_XID_MATCH for code, at in [*seen, *from_labels]
        ):
            from_labels.append((xid, event.at))
    return [(xid, e.at) for e in kernel if (xid := parse_xid_code(e.code)) is not None] + from_labels


def _xid_number(code: str) -> int | None:
    """The Xid of a stored code, Nonfatal or not (a Nonfatal line is still the occurrence a label reports)."""
    number = code.removesuffix(NONFATAL_SUFFIX)
    return int(number) if number.isdigit() else None


def _history(target: GpuIdentity, stored: list[GpuEvent]) -> list[GpuEvent]:
    """This GPU's events under any key it may have been recorded with, each once: under its best key."""
    seen: dict[tuple[str, str, datetime, str], GpuEvent] = {}
    for key in target.store_keys():
        for event in stored:
            if event.gpu_key == key:
                seen.setdefault((event.kind, event.code, event.at, event.alert_key), event)
    return sorted(seen.values(), key=lambda e: e.at)


class RecurrenceEnricher:
    name = "recurrence"
    title = "History of this GPU"
    source = ""

    def __init__(
        self, store: Store, catalog: XidCatalog, window: float, metrics: Metrics | None = None, *, record: bool = True
    ) -> None:
        """`record`: False reads the history without adding this alert's events to it (`explain`)."""
        self._catalog = catalog
        self._window = window
        self._histories: GpuHistory = RecordingHistory(store, metrics) if record else ReadOnlyHistory(store)

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        alert = request.alert
        if is_selftest(alert.labels):
            return EnrichmentSection.skipped(self.name, self.title, "a self-test alert is no GPU incident")
        identity = await resolve_identity(request)
        xid = evidence_of(await request.section("xid"), XidEvidence)
        records = _records(alert, identity, xid.events if xid is not None else [], _label_xid(xid))
        targets = _targets(identity, records)
        since = alert.starts_at - timedelta(seconds=self._window)
        keys = [key for target in targets for key in target.store_keys()]
        stored = await self._histories.record_and_read(GpuHistoryRequest(records, since, keys))
        if not targets:
            return EnrichmentSection.skipped(self.name, self.title, "no GPU named by the alert or its Xid lines")
        now = max([datetime.now(UTC), alert.starts_at, *(r.at for r in records)])
        alert_xid = xid.alert_xid if xid is not None else None
        summaries = []
        for target in targets:
            history = _history(target, stored)
            own = [r for r in records if r.kind == "xid" and target.same_gpu(_identity_of(r))]
            codes = {code for r in own if (code := parse_xid_code(r.code)) is not None and code not in FOLLOWER_XIDS}
            if alert_xid is not None and target.same_gpu(identity):
                codes.add(alert_xid)
            summaries.append(self._summarise(target, alert, history, codes, own, now))
        return self._section(summaries, len(records))

    def _summarise(
        self,
        target: GpuIdentity,
        alert: AlertState,
        history: list[GpuEvent],
        codes: set[int],
        own: list[GpuEvent],
        now: datetime,
    ) -> _GpuSummary:
        """`own`: the Xid records this alert made for this GPU; an Xid nothing else recorded is its first."""
        found = incidents(xid_history(history), self._catalog.burst_window)
        others = incidents(xid_history(e for e in history if not among(e, own)), self._catalog.burst_window)
        alert_episodes = {e.alert_key for e in history if e.kind == "alert" and e.code == alert.alertname}
        firsts = [f"Xid {code}" for code in codes if len(found.get(code, [])) == 1 and not others.get(code)]
        return _GpuSummary(
            identity=target,
            xids={code: len(found.get(code, [])) for code in sorted(codes)},
            alertname=alert.alertname,
            alert_count=len(alert_episodes),
            verdicts=escalate(xid_history(history), self._catalog, now, codes),
            firsts=frozenset(firsts + ([alert.alertname] if alert_episodes == {alert.key} else [])),
        )

    def _section(self, summaries: list[_GpuSummary], recorded: int) -> EnrichmentSection:
        window = window_text(self._window)
        verdicts = sorted((v for s in summaries for v in s.verdicts), key=lambda v: -severity_rank(v.severity))
        counts = [s.counts_text(window, several=len(summaries) > 1) for s in summaries]
        summary = verdicts[0].text if verdicts else counts[0]
        lines = [v.text for v in verdicts[1:]] + (counts if verdicts else counts[1:])
        return EnrichmentSection(
            name=self.name,
            title=self.title,
            status="ok",
            summary=summary,
            lines=lines,
            data=RecurrenceEvidence(
                window=window,
                window_seconds=self._window,
                gpus=[s.to_data() for s in summaries],
                verdicts=[_verdict_data(v) for v in verdicts],
                escalate=bool(verdicts),
                recorded=recorded,
            ),
        )

    async def close(self) -> None:
        await self._histories.close()


@dataclass(frozen=True)
class _GpuSummary:
    identity: GpuIdentity
    xids: dict[int, int]
    alertname: str
    alert_count: int
    verdicts: list[Verdict]
    # What this alert is the only record of in the window ("Xid 79", its alert name): said as "first ...".
    firsts: frozenset[str]

    def counts_text(self, window: str, several: bool) -> str:
        counts = [(f"Xid {code}", n) for code, n in self.xids.items()]
        if self.alertname and self.alert_count:
            counts.append((self.alertname, self.alert_count))
        gpu = f"GPU {_gpu_name(self.identity)}" if several else "this GPU"
        if not counts:
            return f"{_capitalised(gpu)}: nothing recorded in the last {window}"
        if all(what in self.firsts for what, _ in counts):
            return f"First {' and first '.join(what for what, _ in counts)} on {gpu} in the last {window}"
        parts = [_count_text(what, n, what in self.firsts) for what, n in counts]
        return f"{_capitalised(gpu)} in the last {window}: {', '.join(parts)}"

    def to_data(self) -> RecurrenceGpu:
        gpu = self.identity.to_data()
        return RecurrenceGpu(
            gpu_key=self.identity.gpu_key,
            index=gpu.index,
            uuid=gpu.uuid,
            pci_bus_id=gpu.pci_bus_id,
            model=gpu.model,
            host=gpu.host,
            serial=gpu.serial,
            xids={str(code): count for code, count in self.xids.items()},
            alert=AlertCount(name=self.alertname, count=self.alert_count),
            verdicts=[_verdict_data(v) for v in self.verdicts],
        )


def _verdict_data(verdict: Verdict) -> EscalationVerdict:
    return EscalationVerdict(
        rule=verdict.rule, xid=verdict.xid, count=verdict.count, severity=verdict.severity, text=verdict.text
    )


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _count_text(what: str, count: int, first: bool) -> str:
    if first:
        return f"first {what}"
    if count == 0:
        return f"no {what} recorded"
    return f"{what} {'once' if count == 1 else f'{count} times'}"


def _gpu_name(identity: GpuIdentity) -> str:
    return identity.uuid or identity.pci_bus_id or (f"index {identity.index}" if identity.index else "?")


def _label_xid(xid: XidEvidence | None) -> int | None:
    """The Xid the alert's own label reports, unless the Xid enricher found it a stale gauge (then it is an old
    Xid, recorded when it was new). A code read from the gauge's value is left out: it is read when the bot
    enriches, not when the alert started, and an alert on a gauge without the label (DCGMXidGaugeStuck on an
    older dcgm-exporter) starts an hour after the Xid, too late to be matched with it."""
    if xid is None or xid.alert_xid is None or not xid.alert_xid_label or xid.stale_gauge is True:
        return None
    return xid.alert_xid


def _records(
    alert: AlertState, identity: GpuIdentity, events: Sequence[DecodedXidRecord], label_xid: int | None
) -> list[GpuEvent]:
    records = []
    for event in events:
        record = _xid_record(alert, identity, event)
        if record is not None:
            records.append(record)
    if identity.gpu_key:
        records.append(_alert_record(alert, identity, "alert", alert.alertname))
        if label_xid is not None:
            records.append(_alert_record(alert, identity, "xid", xid_code(label_xid)))
    return records


def _alert_record(alert: AlertState, identity: GpuIdentity, kind: Literal["xid", "alert"], code: str) -> GpuEvent:
    """A record of this alert episode on its GPU: the alert itself, or the Xid its label reports."""
    return GpuEvent(
        gpu_key=identity.gpu_key,
        host=identity.host,
        pci_bus_id=identity.pci_bus_id or "",
        uuid=identity.uuid or "",
        kind=kind,
        code=code,
        at=alert.starts_at,
        alert_key=alert.key,
    )


def _xid_record(alert: AlertState, identity: GpuIdentity, event: DecodedXidRecord) -> GpuEvent | None:
    """One kernel Xid as a store record, under its own GPU (a bus drop naming no GPU is not recorded)."""
    pci = PciAddress.parse(event.pci_bus_id or "")
    if pci is None:
        return None
    own = GpuIdentity(host=identity.host, uuid=event.uuid or None, pci=pci)
    gpu = identity.merged(own) if identity.same_gpu(own) else own
    return GpuEvent(
        gpu_key=gpu.gpu_key,
        host=gpu.host,
        pci_bus_id=pci.bus_id,
        uuid=gpu.uuid or "",
        kind="xid",
        code=xid_code(event.xid, nonfatal=event.basis == "nonfatal"),
        at=_time(event.timestamp) or alert.starts_at,
        alert_key="",
    )


def _time(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _identity_of(record: GpuEvent) -> GpuIdentity:
    return GpuIdentity(host=record.host, uuid=record.uuid or None, pci=PciAddress.parse(record.pci_bus_id))


def _targets(identity: GpuIdentity, records: Sequence[GpuEvent]) -> list[GpuIdentity]:
    """The GPUs to report on: the alert's (with what its Xid lines add, such as the UUID), or, for a
    host-level alert, each GPU its Xid lines name."""
    if identity.gpu_key:
        for record in records:
            if record.kind == "xid" and identity.same_gpu(_identity_of(record)):
                identity = identity.merged(_identity_of(record))
        return [identity]
    targets: dict[str, GpuIdentity] = {}
    for record in records:
        targets.setdefault(record.gpu_key, _identity_of(record))
    return list(targets.values())

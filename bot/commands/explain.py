"""`gpu-alert-bot explain PAYLOAD.json` (or `--alert ID`, an alert the bot stored): what the bot would do with an
Alertmanager webhook, without doing it.

For each alert: the routing rules tried (and why each did or did not match), the receivers, the playbook, and
what every receiver would get: the pipeline's own decision (`bot.pipeline.decide`), previewed by each receiver's
sink type (`Sink.preview`, built by `bot.sinks.build_previews`); and the incident the alerts would be told as
(bot/commands/explain_incidents.py), with what each receiver would get of it. Nothing is sent and the store is never
written. Enrichment is skipped unless asked for (`--enrich`); it then runs the configured read-only enrichers
within the usual budget, against the store opened read-only (or an empty temporary one). `--graph out.png`
writes the picture Slack and email would show of each alert's history (out.png, out-2.png, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from bot.commands.explain_incidents import IncidentPreview, payload_incidents, stored_incident
from bot.commands.explain_text import format_text
from bot.commands.stored_alert import StoredAlert, StoredAlertError, stored_alert
from bot.config import BotConfig, Receiver, StoreConfig
from bot.enrich import build_enrichers
from bot.evidence import Enrichment, PrometheusEvidence
from bot.incident.stage import view_message
from bot.message import Message
from bot.metrics import Metrics
from bot.models import AlertState, AmAlert, Delivery, Event, EventKind, WebhookPayload
from bot.pages.links import PageLinks, page_links
from bot.pipeline import Decision, Enrich, decide
from bot.playbooks import Playbook, PlaybookSet
from bot.printable import printable, printable_json
from bot.render.graph import Theme, message_graph, render_alert_graph
from bot.render.graph_worker import GraphRenderer
from bot.routing import Router, RouteTrace
from bot.sinks import build_previews
from bot.store import Store, StoreUnavailable, open_store

OutputFormat = Literal["text", "json"]


class PayloadError(Exception):
    """The file is not an Alertmanager webhook body."""


def read_payload(path: Path) -> WebhookPayload:
    """An Alertmanager webhook body from a file, or from standard input when the path is `-`."""
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise PayloadError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return WebhookPayload.model_validate_json(_unwrap_capture(raw))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise PayloadError(f"{path}: not an Alertmanager webhook body: {problems}") from None


def _unwrap_capture(raw: bytes) -> bytes:
    """A saved request, `{"headers": ..., "body": ...}` (as in tests/fixtures/alertmanager-captures), gives its body."""
    try:
        data = json.loads(raw)
    except ValueError:
        return raw
    if isinstance(data, dict) and {"headers", "body"} <= set(data) and isinstance(data["body"], dict):
        return json.dumps(data["body"]).encode()
    return raw


def run(
    source: Path | str,
    config: BotConfig,
    playbooks: PlaybookSet,
    *,
    enrich: bool,
    output: OutputFormat,
    graph: Path | None = None,
    theme: Theme = "light",
) -> int:
    """The `explain` command, of a webhook body's file (a Path) or of a stored alert (its short id or key, a str):
    print the report on stdout; 0 when done, 2 when the payload is unusable or the alert not found, 1 when a
    picture was asked for (`graph`) and none could be drawn."""
    stored = None
    try:
        if isinstance(source, Path):
            payload = read_payload(source)
        else:
            stored = asyncio.run(stored_alert(config.store, source))
            payload = stored.payload
    except (PayloadError, StoredAlertError) as exc:
        print(printable(str(exc), keep="\n"), file=sys.stderr)
        return 2
    pictures = Pictures(graph, theme) if graph is not None else None
    try:
        report = asyncio.run(explain(payload, config, playbooks, enrich=enrich, pictures=pictures, stored=stored))
    except StoreUnavailable as exc:
        print(f"cannot read the bot's store, which --enrich reads the GPU history from: {exc}", file=sys.stderr)
        return 1
    # Label values are data: a terminal escape in one is shown, never run (as the console sink's JSON does).
    if output == "json":
        print(printable_json(json.dumps(report, indent=2, ensure_ascii=False)))
    else:
        print(printable(format_text(report), keep="\n\t"))
    if pictures is not None and not pictures.written:
        print("no picture written: " + "; ".join(pictures.problems or ["no alert"]), file=sys.stderr)
        return 1
    return 0


class Pictures:
    """Where `--graph` writes each alert's picture: the path given for the first, `-2`, `-3`... for the next."""

    def __init__(self, path: Path, theme: Theme) -> None:
        self._path = path
        self._theme = theme
        self.written: list[Path] = []
        self.problems: list[str] = []

    async def write(self, decision: Decision, number: int) -> dict[str, str]:
        graph = message_graph(decision.enrichment, decision.message)
        if graph is None:
            problem = f"no metric history to draw: {_why_no_history(decision.enrichment)}"
            self.problems.append(problem)
            return {"problem": problem}
        renderer = GraphRenderer()
        if not renderer.available:
            problem = "matplotlib is not installed: pip install 'gpu-alert-bot[graphs]'"
            self.problems.append(problem)
            return {"problem": problem}
        try:
            png = await renderer.render(render_alert_graph, graph, self._theme)
        finally:
            await renderer.close()
        if png is None:
            self.problems.append("drawing failed (see the log)")
            return {"problem": "drawing failed (see the log)"}
        path = self._path if number == 1 else self._path.with_stem(f"{self._path.stem}-{number}")
        path.write_bytes(png)
        self.written.append(path)
        return {"path": str(path)}


def _why_no_history(enrichment: Enrichment) -> str:
    """Why the alert has no picture, in the words of what was missing."""
    section = enrichment.get("prometheus")
    if section is None:
        return "Prometheus was not asked (it is, with --enrich, when enrichment.prometheus is configured)"
    if section.status != "ok":
        return f"Prometheus {section.status}: {section.reason}"
    evidence = enrichment.evidence(PrometheusEvidence)
    if evidence is None or evidence.history is None:
        return section.summary.removeprefix("History unavailable: ")
    if evidence.value_meaning is None:
        return f"{evidence.graphed} is a function of a code, not a count"
    return "one point of history in the window, two at least are drawn"


async def explain(
    payload: WebhookPayload,
    config: BotConfig,
    playbooks: PlaybookSet,
    *,
    enrich: bool = False,
    pictures: Pictures | None = None,
    stored: StoredAlert | None = None,
) -> dict[str, Any]:
    """The whole report as JSON-ready data; `format_text` prints the same content for people. `stored`: the stored
    alert the payload is made of (`--alert`), with its incident."""
    router = Router(config.routing)
    now = datetime.now(UTC)
    decided: list[tuple[AlertState, Decision]] = []
    graphs: list[dict[str, str] | None] = []
    async with _enrichment(config, playbooks, enrich) as enrich_alert:
        for number, am_alert in enumerate(payload.alerts, 1):
            alert = _alert_state(am_alert, payload, now)
            kind = EventKind.FIRING if alert.status == "firing" else EventKind.RESOLVED
            event = Event(id=0, kind=kind, created_at=now, alert=alert)
            decision = await decide(event, playbooks, router, enrich_alert)
            decided.append((alert, decision))
            graphs.append(await pictures.write(decision, number) if pictures is not None else None)
    if stored is not None and stored.incident is not None:
        [(alert, decision)] = decided
        incidents = [stored_incident(stored.incident, alert, decision, stored.told_alone)]
    else:
        incidents = payload_incidents(decided, config, now)
    preview = _Previews(config.receivers, now, page_links(config.server))
    alerts = []
    for (alert, decision), graph in zip(decided, graphs, strict=True):
        alerts.append(_alert_report(alert, decision, router, enrich, incidents, preview))
        if graph is not None:
            alerts[-1]["graph"] = graph
    return {
        "payload": {
            "receiver": payload.receiver_name,
            "group_key": payload.group_key,
            "status": payload.status,
            "alerts": len(payload.alerts),
            "truncated_alerts": payload.truncated_alerts,
        },
        "alerts": alerts,
        "incidents": [_incident_report(incident, config, preview) for incident in incidents],
    }


def _alert_report(
    alert: AlertState,
    decision: Decision,
    router: Router,
    enrich: bool,
    incidents: Sequence[IncidentPreview],
    preview: _Previews,
) -> dict[str, Any]:
    """One alert: its route, playbook and evidence, its incident, and the messages of its own (none when it is told
    only as a line of its incident)."""
    report: dict[str, Any] = {
        "alertname": alert.alertname,
        "status": alert.status,
        "alert_key": alert.key,
        "labels": alert.labels,
        "route": _route_report(decision.route, router),
        "playbook": decision.playbook.name,
        "enrichment": _enrichment_report(decision.enrichment, enrich),
    }
    incident = next((i for i in incidents if alert.key in i.members), None)
    told_alone = incident is None or alert.key in incident.told_alone
    if incident is not None:
        view = incident.view
        report["incident"] = {"id": view.id, "title": view.title, "told_alone": told_alone}
    report["messages"] = [preview(name, decision.message) for name in decision.receivers] if told_alone else []
    return report


def _incident_report(incident: IncidentPreview, config: BotConfig, preview: _Previews) -> dict[str, Any]:
    view = incident.view
    message = view_message(view)
    return {
        "id": view.id,
        "title": view.title,
        "state": view.status,
        "stored": incident.stored,
        "alerts": view.scope.alerts,
        "threshold": config.incidents.threshold,
        "receivers": list(incident.receivers),
        "messages": [preview(name, message) for name in incident.receivers],
    }


def _alert_state(alert: AmAlert, payload: WebhookPayload, now: datetime) -> AlertState:
    return AlertState(
        key=alert.key,
        fingerprint=alert.fingerprint,
        status=alert.status,
        labels=alert.labels,
        annotations=alert.annotations,
        starts_at=alert.starts_at,
        ends_at=alert.ends_at,
        generator_url=alert.generator_url,
        group_key=payload.group_key,
        receiver=payload.receiver_name,
        external_url=payload.external_url,
        first_seen=now,
        last_seen=now,
        resolved_at=(alert.ends_at or now) if alert.status == "resolved" else None,
    )


# --- enrichment, only on request -------------------------------------------------------------------------
async def _no_enrichment(_alert: AlertState, _playbook: Playbook) -> Enrichment:
    return Enrichment()


@contextlib.asynccontextmanager
async def _enrichment(config: BotConfig, playbooks: PlaybookSet, enabled: bool) -> AsyncIterator[Enrich]:
    if not enabled:
        yield _no_enrichment
        return
    async with _read_only_store(config.store) as store:
        runner = build_enrichers(
            config.enrichment, store, Metrics(), playbooks.xid_catalog, config.remediation, read_only=True
        )
        try:
            yield runner.run
        finally:
            await runner.close()


@contextlib.asynccontextmanager
async def _read_only_store(config: StoreConfig) -> AsyncIterator[Store]:
    """The configured store opened read-only; an empty throw-away one when there is none yet (an SQLite file
    not created yet: no history to read). A store there but unreadable raises StoreUnavailable."""
    if config.backend == "sqlite" and not config.path.exists():
        with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-explain-") as scratch:
            empty = await open_store(config.model_copy(update={"path": Path(scratch) / "empty.db"}))
            try:
                yield empty
            finally:
                await empty.close()
        return
    store = await open_store(config, read_only=True)
    try:
        yield store
    finally:
        await store.close()


def _enrichment_report(enrichment: Enrichment, enabled: bool) -> dict[str, Any]:
    if not enabled:
        return {"ran": False, "sections": []}
    sections = [
        {"name": s.name, "status": s.status, "reason": s.reason, "summary": s.summary} for s in enrichment.sections
    ]
    return {"ran": True, "sections": sections}


# --- routing ---------------------------------------------------------------------------------------------
def _route_report(trace: RouteTrace, router: Router) -> dict[str, Any]:
    rules = []
    for check in trace.checks:
        entry: dict[str, Any] = {
            "rule": check.rule.number,
            "matchers": [str(m) for m in check.rule.matchers],
            "receivers": list(check.rule.receivers),
            "continue": check.rule.continue_,
            "matched": check.matched,
        }
        if check.mismatch is not None:
            entry["failed_matcher"] = str(check.mismatch)
            entry["label"] = check.mismatch.name
            entry["label_value"] = check.actual
        rules.append(entry)
    return {
        "receivers": list(trace.decision.receivers),
        "default": trace.decision.used_default,
        "default_receivers": list(router.default),
        "rules": rules,
        "not_evaluated": [rule.number for rule in trace.skipped],
    }


# --- what each receiver would get ----------------------------------------------------------------------
class _Previews:
    """What each configured receiver would send of a message, rendered by its sink's own code."""

    def __init__(self, receivers: Sequence[Receiver], now: datetime, links: PageLinks | None) -> None:
        self._receivers = {receiver.name: receiver for receiver in receivers}
        self._previewers = build_previews(receivers, links)
        self._now = now

    def __call__(self, name: str, message: Message) -> dict[str, Any]:
        delivery = Delivery(
            id=0,
            event_id=0,
            alert_key=message.alert_key,
            receiver=name,
            message=message,
            attempts=0,
            created_at=self._now,
        )
        receiver = self._receivers[name]
        return {"receiver": name, "type": receiver.type, **self._previewers[name].preview(delivery)}

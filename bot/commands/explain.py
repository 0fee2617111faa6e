"""`gpu-alert-bot explain PAYLOAD.json` (or `--alert ID`, an alert the bot stored): what the bot would do with an
Alertmanager webhook, without doing it.

For each alert: the routing rules tried (and why each did or did not match), the receivers, the playbook, and
what every receiver would get: the pipeline's own decision (`bot.pipeline.decide`), previewed by each receiver's
sink type (`Sink.preview`, built by `bot.sinks.build_previews`). Nothing is sent and the store is never
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

from bot.commands.stored_alert import StoredAlertError, stored_payload
from bot.config import BotConfig, Receiver, StoreConfig
from bot.enrich import build_enrichers
from bot.evidence import Enrichment
from bot.message import Message
from bot.metrics import Metrics
from bot.models import AlertState, AmAlert, Delivery, Event, EventKind, WebhookPayload
from bot.pages.links import page_links
from bot.pipeline import Decision, Enrich, decide
from bot.playbooks import Playbook, PlaybookSet
from bot.printable import printable, printable_json
from bot.render.graph import Theme, message_graph, render_alert_graph
from bot.render.graph_worker import GraphRenderer
from bot.routing import Router, RouteTrace
from bot.sinks import Previewer, build_previews
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
    try:
        if isinstance(source, Path):
            payload = read_payload(source)
        else:
            payload = asyncio.run(stored_payload(config.store, source))
    except (PayloadError, StoredAlertError) as exc:
        print(printable(str(exc), keep="\n"), file=sys.stderr)
        return 2
    pictures = Pictures(graph, theme) if graph is not None else None
    try:
        report = asyncio.run(explain(payload, config, playbooks, enrich=enrich, pictures=pictures))
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
            problem = "no metric history to draw (two points at least; the Prometheus enricher runs with --enrich)"
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


async def explain(
    payload: WebhookPayload,
    config: BotConfig,
    playbooks: PlaybookSet,
    *,
    enrich: bool = False,
    pictures: Pictures | None = None,
) -> dict[str, Any]:
    """The whole report as JSON-ready data; `format_text` prints the same content for people."""
    router = Router(config.routing)
    receivers = {r.name: r for r in config.receivers}
    previews = build_previews(config.receivers, page_links(config.server))
    now = datetime.now(UTC)
    async with _enrichment(config, playbooks, enrich) as enrich_alert:
        alerts = []
        for number, am_alert in enumerate(payload.alerts, 1):
            alert = _alert_state(am_alert, payload, now)
            kind = EventKind.FIRING if alert.status == "firing" else EventKind.RESOLVED
            event = Event(id=0, kind=kind, created_at=now, alert=alert)
            decision = await decide(event, playbooks, router, enrich_alert)
            alerts.append(
                {
                    "alertname": alert.alertname,
                    "status": alert.status,
                    "alert_key": alert.key,
                    "labels": alert.labels,
                    "route": _route_report(decision.route, router),
                    "playbook": decision.playbook.name,
                    "enrichment": _enrichment_report(decision.enrichment, enrich),
                    "messages": [
                        _preview(receivers[name], previews[name], decision.message, now) for name in decision.receivers
                    ],
                }
            )
            if pictures is not None:
                alerts[-1]["graph"] = await pictures.write(decision, number)
    return {
        "payload": {
            "receiver": payload.receiver_name,
            "group_key": payload.group_key,
            "status": payload.status,
            "alerts": len(payload.alerts),
            "truncated_alerts": payload.truncated_alerts,
        },
        "alerts": alerts,
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
def _preview(receiver: Receiver, previewer: Previewer, message: Message, now: datetime) -> dict[str, Any]:
    delivery = Delivery(
        id=0,
        event_id=0,
        alert_key=message.alert_key,
        receiver=receiver.name,
        message=message,
        attempts=0,
        created_at=now,
    )
    return {"receiver": receiver.name, "type": receiver.type, **previewer.preview(delivery)}


# --- for people ------------------------------------------------------------------------------------------
def format_text(report: dict[str, Any]) -> str:
    payload = report["payload"]
    lines = [
        f"Payload: receiver {payload['receiver']!r}, group {payload['group_key']}, status {payload['status']}, "
        f"{payload['alerts']} alert(s)"
    ]
    if payload["truncated_alerts"]:
        lines.append(f"  Alertmanager left out {payload['truncated_alerts']} more alert(s) (truncatedAlerts).")
    for number, alert in enumerate(report["alerts"], 1):
        lines += ["", f"=== Alert {number} of {len(report['alerts'])}: {alert['alertname']} ({alert['status']}) ==="]
        lines += _alert_text(alert)
    return "\n".join(lines)


def _alert_text(alert: dict[str, Any]) -> list[str]:
    labels = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in alert["labels"].items())
    lines = [f"Labels:     {labels}", f"Alert key:  {alert['alert_key']}", "Routing:"]
    lines += [f"  {line}" for line in _route_text(alert["route"])]
    lines.append(f"Playbook:   {alert['playbook']}")
    lines.append(f"Enrichment: {_enrichment_text(alert['enrichment'])}")
    if "graph" in alert:
        lines.append(f"Graph:      {alert['graph'].get('path') or alert['graph'].get('problem')}")
    for entry in alert["messages"]:
        lines += ["", f"--- {entry['receiver']} ({entry['type']}) ---", *_message_text(entry)]
    return lines


def _route_text(route: dict[str, Any]) -> list[str]:
    lines = []
    for rule in route["rules"]:
        matchers = "{" + ", ".join(rule["matchers"]) + "}"
        if rule["matched"]:
            verdict = "matched" + (", continue" if rule["continue"] else "")
            lines.append(f"rule {rule['rule']} {matchers}: {verdict} -> {', '.join(rule['receivers'])}")
        else:
            value = "not set" if rule["label_value"] is None else f"is {json.dumps(rule['label_value'])}"
            lines.append(
                f"rule {rule['rule']} {matchers}: no, {rule['failed_matcher']} fails ({rule['label']} {value})"
            )
    if route["not_evaluated"]:
        numbers = ", ".join(str(n) for n in route["not_evaluated"])
        noun = "rules" if len(route["not_evaluated"]) > 1 else "rule"
        lines.append(f"{noun} {numbers}: not evaluated (a matching rule without continue stopped the search)")
    if route["default"]:
        lines.append(f"no rule matched: default receivers -> {', '.join(route['receivers']) or '(none)'}")
    else:
        lines.append(f"receivers -> {', '.join(route['receivers'])}")
    return lines


def _enrichment_text(enrichment: dict[str, Any]) -> str:
    if not enrichment["ran"]:
        return "skipped (--enrich runs the configured enrichers)"
    if not enrichment["sections"]:
        return "no enricher configured"
    return "; ".join(
        f"{s['name']} {s['status']}" + (f" ({s['reason']})" if s["reason"] else "") for s in enrichment["sections"]
    )


def _message_text(entry: dict[str, Any]) -> Sequence[str]:
    if "payload" in entry:
        return [f"channel {entry['channel']}", json.dumps(entry["payload"], indent=2, ensure_ascii=False)]
    if "email" in entry:
        email = entry["email"]
        return [*(f"{name}: {value}" for name, value in email["headers"].items()), "", email["text"].rstrip()]
    if "event" in entry:
        if entry["event"] is None:
            return ["nothing is sent for this event"]
        return [f"POST {entry['url']}", json.dumps(entry["event"], indent=2, ensure_ascii=False)]
    if "line" in entry:
        return [json.dumps(entry["line"], ensure_ascii=False)]
    shown = {key: value for key, value in entry.items() if key not in ("receiver", "type")}
    return [json.dumps(shown, indent=2, ensure_ascii=False)]

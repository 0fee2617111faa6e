"""The backend-neutral store core: every decision the store takes, shared by SQLite and PostgreSQL.

A backend only stores and fetches. What a webhook batch makes of copies, what a stored notification does to
the alert records and which events it queues, in which order one alert's events and one receiver's deliveries
may go, and how rows become the bot's records are all decided here, so both backends behave the same.
Timestamps are stored as seconds since the epoch (a float) and labels, annotations and enrichment as JSON text
in both backends, which also makes `store copy` a plain row copy.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from bot.models import AlertState, AmAlert, EventKind, GpuEvent, GpuHistoryRequest, WebhookPayload
from bot.storage.interface import (
    ActionRun,
    AuditEntry,
    BreakerState,
    DeliveryRecord,
    EventRecord,
    IncomingNotification,
    IngestResult,
    Planner,
    WatchdogRecord,
)

# An event waits while an earlier one of the same alert is pending (a retried firing, say): a resolve routed
# first would reach PagerDuty before the trigger and leave an incident open for good. (`e` is the event.)
EVENT_NOT_BLOCKED = """NOT EXISTS (SELECT 1 FROM events p WHERE p.alert_key = e.alert_key AND p.state = 'pending'
                                   AND p.id < e.id)"""
# A delivery waits while an earlier one for the same alert is pending: an update never overtakes a post.
DELIVERY_NOT_BLOCKED = """NOT EXISTS (SELECT 1 FROM deliveries p WHERE p.receiver = d.receiver
                                      AND p.state = 'pending' AND p.alert_key = d.alert_key AND p.id < d.id)"""
MAX_ERROR_CHARS = 2000


class Row(Protocol):
    """A row by column name: sqlite3.Row and psycopg's dict rows both are."""

    def __getitem__(self, key: str, /) -> Any: ...


def ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def dt(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


# --- ingest ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IngestSplit:
    """A batch of webhooks split into the notifications to store and the copies to count."""

    fresh: list[IncomingNotification]
    # For each webhook of the batch, its place in `fresh`, or None for a copy.
    positions: list[int | None]
    copies: Counter[str]

    def results(self, fresh_ids: Sequence[int]) -> list[IngestResult]:
        """The answer to each webhook of the batch, given the ids the fresh notifications were stored under."""
        return [
            IngestResult(accepted=True, duplicate=True)
            if position is None
            else IngestResult(accepted=True, duplicate=False, notification_id=fresh_ids[position])
            for position in self.positions
        ]


def split_copies(batch: Sequence[IncomingNotification], taken: set[str]) -> IngestSplit:
    """`taken` holds the keys the store already has within the dedup window; a key earlier in the same batch
    makes a copy too."""
    seen = set(taken)
    fresh: list[IncomingNotification] = []
    positions: list[int | None] = []
    copies: Counter[str] = Counter()
    for notification in batch:
        if notification.idempotency_key in seen:
            copies[notification.idempotency_key] += 1
            positions.append(None)
        else:
            seen.add(notification.idempotency_key)
            positions.append(len(fresh))
            fresh.append(notification)
    return IngestSplit(fresh, positions, copies)


# --- dedup: a stored notification applied to the alert records ------------------------------------------
@dataclass(frozen=True)
class NewAlert:
    key: str
    fingerprint: str
    alertname: str
    status: str
    labels: str
    annotations: str
    starts_at: float
    ends_at: float | None
    generator_url: str
    group_key: str
    receiver: str
    external_url: str
    first_seen: float
    last_seen: float
    resolved_at: float | None

    def row(self) -> tuple[Any, ...]:
        """Values in the order of ALERT_INSERT_COLUMNS."""
        return (
            self.key,
            self.fingerprint,
            self.alertname,
            self.status,
            self.labels,
            self.annotations,
            self.starts_at,
            self.ends_at,
            self.generator_url,
            self.group_key,
            self.receiver,
            self.external_url,
            self.first_seen,
            self.last_seen,
            1,
            self.resolved_at,
        )


ALERT_INSERT_COLUMNS = (
    "key, fingerprint, alertname, status, labels, annotations, starts_at, ends_at, generator_url, group_key, "
    "receiver, external_url, first_seen, last_seen, times_seen, resolved_at"
)


@dataclass(frozen=True)
class AlertUpdate:
    """A known episode heard of again. `ends_at` None keeps the stored end."""

    key: str
    status: str
    annotations: str
    ends_at: float | None
    last_seen: float
    resolved_at: float | None
    # Firing again after a resolve is a new state: nobody has acknowledged it yet.
    clears_ack: bool = False

    def row(self) -> tuple[Any, ...]:
        """Values in the order of the placeholders of ALERT_UPDATE (with the backend's parameter marks)."""
        clear = int(self.clears_ack)
        return (self.status, self.annotations, self.ends_at, self.last_seen, self.resolved_at, clear, clear, self.key)


ALERT_UPDATE = """UPDATE alerts SET status = {p}, annotations = {p}, ends_at = COALESCE({p}, ends_at),
                      last_seen = {p}, times_seen = times_seen + 1, resolved_at = {p},
                      acked_by = CASE WHEN {p} = 1 THEN NULL ELSE acked_by END,
                      acked_at = CASE WHEN {p} = 1 THEN NULL ELSE acked_at END WHERE key = {p}"""


@dataclass
class NotificationPlan:
    """Everything one stored notification writes, decided before anything is written."""

    new_alerts: list[NewAlert] = field(default_factory=list)
    updates: list[AlertUpdate] = field(default_factory=list)
    events: list[tuple[str, EventKind]] = field(default_factory=list)
    # The group whose resolve time to record: a later identical notification is then no copy.
    resolved_group: str | None = None


ParsedNotification = tuple[WebhookPayload, list[AmAlert]]


def read_notification(body: bytes) -> ParsedNotification:
    """The stored body and its alerts, one per episode even if a sender repeated an alert inside one body (the
    last copy wins). Raises ValueError for a body this version cannot read."""
    payload = WebhookPayload.model_validate_json(body)
    return payload, episodes(payload)


def episodes(payload: WebhookPayload) -> list[AmAlert]:
    return list({alert.key: alert for alert in payload.alerts}.values())


def plan_notification(
    payload: WebhookPayload,
    alerts: Sequence[AmAlert],
    known: Mapping[str, AlertState],
    planner: Planner,
    now: float,
) -> NotificationPlan:
    plan = NotificationPlan()
    for decision in planner(known, alerts, payload.group_key, now=datetime.fromtimestamp(now, UTC)):
        alert = decision.alert
        previous = known.get(alert.key)
        if previous is None:
            plan.new_alerts.append(_new_alert(payload, alert, now))
        else:
            plan.updates.append(_alert_update(previous, alert, now, keep_status=decision.stale))
        if decision.event is not None:
            plan.events.append((alert.key, decision.event))
        if decision.event is EventKind.RESOLVED:
            plan.resolved_group = payload.group_key
    return plan


def _new_alert(payload: WebhookPayload, alert: AmAlert, now: float) -> NewAlert:
    return NewAlert(
        key=alert.key,
        fingerprint=alert.fingerprint,
        alertname=alert.labels.get("alertname", ""),
        status=alert.status,
        labels=json.dumps(alert.labels, sort_keys=True),
        annotations=json.dumps(alert.annotations, sort_keys=True),
        starts_at=alert.starts_at.timestamp(),
        ends_at=ts(alert.ends_at),
        generator_url=alert.generator_url,
        group_key=payload.group_key,
        receiver=payload.receiver_name,
        external_url=payload.external_url,
        first_seen=now,
        last_seen=now,
        resolved_at=(ts(alert.ends_at) or now) if alert.status == "resolved" else None,
    )


def _alert_update(previous: AlertState, alert: AmAlert, now: float, keep_status: bool) -> AlertUpdate:
    status = previous.status if keep_status else alert.status
    resolved_at = None
    if status == "resolved":
        resolved_at = ts(previous.resolved_at) or ts(alert.ends_at) or now
    return AlertUpdate(
        key=previous.key,
        status=status,
        annotations=json.dumps(alert.annotations, sort_keys=True),
        ends_at=None if keep_status else ts(alert.ends_at),
        last_seen=now,
        resolved_at=resolved_at,
        clears_ack=previous.status == "resolved" and status == "firing",
    )


# --- rows -> records -----------------------------------------------------------------------------------
# An alert's columns as `alert_from_row` reads them, without its evidence (`list_alerts(..., evidence=False)`).
ALERT_WITHOUT_EVIDENCE = """key, fingerprint, status, labels, annotations, starts_at, ends_at, generator_url, group_key,
receiver, external_url, first_seen, last_seen, times_seen, resolved_at, acked_by, acked_at, NULL AS enrichment,
silence_id, silenced_by, silenced_until"""


def alert_from_row(row: Row) -> AlertState:
    return AlertState(
        key=row["key"],
        fingerprint=row["fingerprint"],
        status=row["status"],
        labels=json.loads(row["labels"]),
        annotations=json.loads(row["annotations"]),
        starts_at=datetime.fromtimestamp(row["starts_at"], UTC),
        ends_at=dt(row["ends_at"]),
        generator_url=row["generator_url"],
        group_key=row["group_key"],
        receiver=row["receiver"],
        external_url=row["external_url"],
        first_seen=datetime.fromtimestamp(row["first_seen"], UTC),
        last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
        times_seen=row["times_seen"],
        resolved_at=dt(row["resolved_at"]),
        acked_by=row["acked_by"],
        acked_at=dt(row["acked_at"]),
        enrichment=json.loads(row["enrichment"]) if row["enrichment"] else None,
        silence_id=row["silence_id"],
        silenced_by=row["silenced_by"],
        silenced_until=dt(row["silenced_until"]),
    )


def event_record_from_row(row: Row) -> EventRecord:
    return EventRecord(
        id=row["id"],
        alert_key=row["alert_key"],
        kind=EventKind(row["kind"]),
        state=row["state"],
        created_at=datetime.fromtimestamp(row["created_at"], UTC),
        attempts=row["attempts"],
        error=row["error"],
    )


# The deliveries of one alert, with the kind of event each carried (the self-test follows an alert through them).
ALERT_DELIVERIES = """SELECT e.kind, d.receiver, d.state, d.attempts, d.error FROM deliveries d
                      JOIN events e ON e.id = d.event_id WHERE d.alert_key = {p} ORDER BY d.id"""


def delivery_record_from_row(row: Row) -> DeliveryRecord:
    return DeliveryRecord(
        event_kind=EventKind(row["kind"]),
        receiver=row["receiver"],
        state=row["state"],
        attempts=row["attempts"],
        error=row["error"],
    )


def gpu_event_from_row(row: Row) -> GpuEvent:
    return GpuEvent(
        gpu_key=row["gpu_key"],
        host=row["host"],
        pci_bus_id=row["pci_bus_id"],
        uuid=row["uuid"],
        kind=row["kind"],
        code=row["code"],
        at=datetime.fromtimestamp(row["at"], UTC),
        alert_key=row["alert_key"],
    )


GpuEventRow = tuple[str, str, str, str, str, str, float, str]
_GPU_EVENT_COLUMNS = ("gpu_key", "host", "pci_bus_id", "uuid", "kind", "code", "at", "alert_key")


def gpu_event_row(e: GpuEvent) -> GpuEventRow:
    """A GPU event as stored: (gpu_key, host, pci_bus_id, uuid, kind, code, at, alert_key)."""
    return (e.gpu_key, e.host, e.pci_bus_id, e.uuid, e.kind, e.code, e.at.timestamp(), e.alert_key)


def gpu_event_identity(row: GpuEventRow) -> tuple[str, str, str, float, str]:
    """What makes a GPU event one (the table's unique key): recorded again, it is kept once."""
    gpu_key, _host, _pci_bus_id, _uuid, kind, code, at, alert_key = row
    return (gpu_key, kind, code, at, alert_key)


def gpu_events_to_record(requests: Sequence[GpuHistoryRequest]) -> list[GpuEventRow]:
    """A batch's GPU events, each once (the first request's copy), in the order of their unique key: two replicas
    recording overlapping events insert them in one order, so neither waits for a row the other waits for
    (a deadlock)."""
    rows: dict[tuple[str, str, str, float, str], GpuEventRow] = {}
    for request in requests:
        for event in request.events:
            row = gpu_event_row(event)
            rows.setdefault(gpu_event_identity(row), row)
    return [rows[identity] for identity in sorted(rows)]


def gpu_history_window(requests: Sequence[GpuHistoryRequest]) -> tuple[list[str], float]:
    """What a batch reads of the stored GPU history: every GPU key a request asks for, since the earliest time."""
    keys = sorted({key for request in requests for key in request.gpu_keys})
    return keys, min((request.since.timestamp() for request in requests), default=0.0)


def gpu_histories(requests: Sequence[GpuHistoryRequest], stored: Sequence[Row]) -> list[list[GpuEvent]]:
    """Each request's history, oldest first, from one read of what was stored before the batch (its
    `gpu_history_window`) and what the batch records: a request sees the stored events and those it and the
    requests before it record, each once, and none that a later one records, as if each ran alone in turn."""
    known: set[tuple[str, str, str, float, str]] = set()
    by_gpu: dict[str, list[GpuEventRow]] = {}

    def add(row: GpuEventRow) -> None:
        identity = gpu_event_identity(row)
        if identity not in known:
            known.add(identity)
            by_gpu.setdefault(row[0], []).append(row)

    for stored_row in stored:
        add(_stored_gpu_event_row(stored_row))
    found: list[list[GpuEvent]] = []
    for request in requests:
        for event in request.events:
            add(gpu_event_row(event))
        since = request.since.timestamp()
        rows = [row for key in dict.fromkeys(request.gpu_keys) for row in by_gpu.get(key, ()) if row[6] >= since]
        rows.sort(key=lambda row: row[6])
        found.append([gpu_event_from_row(dict(zip(_GPU_EVENT_COLUMNS, row, strict=True))) for row in rows])
    return found


def _stored_gpu_event_row(row: Row) -> GpuEventRow:
    return (
        row["gpu_key"], row["host"], row["pci_bus_id"], row["uuid"], row["kind"], row["code"], float(row["at"]),
        row["alert_key"],
    )  # fmt: skip


def audit_from_row(row: Row) -> AuditEntry:
    return AuditEntry(
        at=datetime.fromtimestamp(row["at"], UTC),
        actor=row["actor"],
        action=row["action"],
        target=row["target"],
        outcome=row["outcome"],
        detail=row["detail"],
    )


def watchdog_from_row(row: Row) -> WatchdogRecord:
    return WatchdogRecord(
        replica=row["replica"],
        last_seen=datetime.fromtimestamp(row["last_seen"], UTC),
        alerted_since=dt(row["alerted_since"]),
    )


def action_run_from_row(row: Row) -> ActionRun:
    return ActionRun(
        id=row["id"],
        action=row["action"],
        alert_key=row["alert_key"],
        target=row["target"],
        gpu=row["gpu"],
        requested_by=row["requested_by"],
        automatic=bool(row["automatic"]),
        dry_run=bool(row["dry_run"]),
        state=row["state"],
        requested_at=datetime.fromtimestamp(row["requested_at"], UTC),
        updated_at=datetime.fromtimestamp(row["updated_at"], UTC),
        approvals=tuple(json.loads(row["approvals"])),
        detail=row["detail"],
    )


def breaker_from_row(row: Row) -> BreakerState:
    return BreakerState(datetime.fromtimestamp(row["opened_at"], UTC), row["reason"])


BREAKER_CLOSE = "DELETE FROM remediation_breaker"
BREAKER_WINDOW_START = """INSERT INTO remediation_breaker_window (id, since) VALUES (1, {p})
                          ON CONFLICT (id) DO UPDATE SET since = excluded.since"""
BREAKER_WINDOW = "SELECT since FROM remediation_breaker_window WHERE id = 1"


# --- acks, silences, action runs: the conditions both backends write under ------------------------------
# Only a firing episode nobody acknowledged yet can be acknowledged (a second click changes nothing).
ALERT_ACK = """UPDATE alerts SET acked_by = {p}, acked_at = {p}
               WHERE key = {p} AND status = 'firing' AND acked_by IS NULL"""
ALERT_UNACK = "UPDATE alerts SET acked_by = NULL, acked_at = NULL WHERE key = {p} AND acked_by IS NOT NULL"
ALERT_SET_SILENCE = """UPDATE alerts SET silence_id = {p}, silenced_by = {p}, silenced_until = {p},
                       silence_claimed_at = NULL WHERE key = {p}"""
# One silence per episode: a request takes the episode's silence slot before it asks Alertmanager, so a second
# request (a double click, another replica) finds it taken. A slot taken longer ago than the caller's `stale`
# time (its process died between claim and silence) may be taken again.
ALERT_CLAIM_SILENCE = """UPDATE alerts SET silenced_by = {p}, silence_claimed_at = {p}
                         WHERE key = {p} AND status = 'firing' AND silence_id IS NULL
                         AND (silence_claimed_at IS NULL OR silence_claimed_at < {p})"""
ALERT_RELEASE_SILENCE = """UPDATE alerts SET silenced_by = NULL, silence_claimed_at = NULL
                           WHERE key = {p} AND silence_id IS NULL AND silence_claimed_at = {p}"""
SILENCED_ALERTS = "SELECT * FROM alerts WHERE silence_id IS NOT NULL ORDER BY key"

ACTION_RUN_COLUMNS = (
    "action, alert_key, target, gpu, requested_by, automatic, dry_run, state, requested_at, updated_at, "
    "approvals, detail"
)


def action_run_row(run: ActionRun) -> tuple[Any, ...]:
    """Values in the order of ACTION_RUN_COLUMNS (flags as 0/1 and approvals as JSON text, in both backends)."""
    return (
        run.action,
        run.alert_key,
        run.target,
        run.gpu,
        run.requested_by,
        int(run.automatic),
        int(run.dry_run),
        run.state,
        run.requested_at.timestamp(),
        run.updated_at.timestamp(),
        json.dumps(list(run.approvals)),
        run.detail,
    )


# Compare-and-set: the run moves only from the state the caller saw; a replica that lost the race gets no row.
ACTION_RUN_TRANSITION = """UPDATE action_runs SET state = {p}, updated_at = {p}, detail = COALESCE({p}, detail),
                           approvals = COALESCE({p}, approvals) WHERE id = {p} AND state = {p} RETURNING *"""


def action_run_transition_row(
    run_id: int, expected: str, state: str, at: datetime, detail: str | None, approvals: Sequence[str] | None
) -> tuple[Any, ...]:
    """Values in the order of the placeholders of ACTION_RUN_TRANSITION."""
    encoded = None if approvals is None else json.dumps(list(approvals))
    return (state, at.timestamp(), detail, encoded, run_id, expected)


# --- store copy: what moves from one store to another ----------------------------------------------------
# What a site keeps when it moves (SQLite to PostgreSQL): the alert records with their enrichment, acks and
# silences, the conversations (Slack threads, email Message-IDs), the GPU history that recurrence counts, the
# audit log, the dead man's switch timers, the remediation runs and breaker, the incidents and their alerts.
# Work in progress (notifications, events, deliveries) is not moved: stop the old bot once its queues drained.
COPIED_TABLES: dict[str, tuple[str, ...]] = {
    "alerts": (
        *ALERT_INSERT_COLUMNS.split(", "),
        "acked_by",
        "acked_at",
        "enrichment",
        "silence_id",
        "silenced_by",
        "silenced_until",
    ),
    "sink_state": ("receiver", "key", "value", "updated_at"),
    "gpu_events": _GPU_EVENT_COLUMNS,
    "audit_log": ("at", "actor", "action", "target", "outcome", "detail"),
    "alert_short_ids": ("short_id", "alert_key"),
    # The dead man's switch goes on where it was (an alert it raised is cleared, not raised again), remediation
    # keeps its history (the rails count past runs) and an open circuit breaker stays open (a closed one counts
    # from its last reset).
    "watchdog": ("replica", "last_seen", "alerted_since"),
    "action_runs": ("id", *ACTION_RUN_COLUMNS.split(", ")),
    "remediation_breaker": ("id", "opened_at", "reason"),
    "remediation_breaker_window": ("id", "since"),
    # An open incident goes on where it was: its alerts' changes update the same card, mail thread and page.
    "incidents": (
        "id",
        "alertname",
        "playbook",
        "state",
        "opened_at",
        "last_joined_at",
        "resolved_at",
        "version",
        "analysis",
        "gathers",
        "apart",
        "grew_at",
        "analysed_at",
        "receivers",
    ),
    "incident_members": ("alert_key", "incident_id", "joined_at", "alone", "host"),
}
# Tables whose ids are copied as they are: the destination's id sequence must then go on after them.
COPIED_WITH_SERIAL_ID = frozenset({"action_runs"})


def copied_columns(table: str) -> tuple[str, ...]:
    """The columns `store copy` moves; raises KeyError for a table it does not move (never a name from input)."""
    return COPIED_TABLES[table]

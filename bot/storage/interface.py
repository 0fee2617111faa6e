"""The Store interface: everything the bot persists, behind one small async API.

bot/store/ implements it: SQLite (bot/store/sqlite/) is the default; a PostgreSQL backend (bot/store/postgresql/) for
several replicas implements the same methods.
Methods that change several things do so in one transaction, which is what makes a crash at any point safe.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from bot.dedup import AlertDecision
from bot.incident.membership import IncidentArrival, IncidentRule, Membership
from bot.incident.model import AlertLine
from bot.incident.record import IncidentAdvance, IncidentRecord, Origin
from bot.models import (
    AlertState,
    AmAlert,
    Delivery,
    Event,
    EventKind,
    EventRoute,
    GpuEvent,
    GpuHistoryRequest,
    IncidentRoute,
    WebhookPayload,
)

# Re-exported: the records Store's methods return are imported from here by the rest of the bot.
from bot.storage.entries import ActionRun as ActionRun
from bot.storage.entries import AuditEntry as AuditEntry
from bot.storage.entries import BreakerState as BreakerState
from bot.storage.entries import DeliveryRecord as DeliveryRecord
from bot.storage.entries import WatchdogRecord as WatchdogRecord
from bot.storage.pages import AlertPage, AlertQuery, IncidentHead

# A receiver's deliveries go in two lanes: an alert's never wait behind an incident's, and the other way round.
Lane = Literal["alerts", "incidents"]

# The part of the bot a process runs (`serve --role`): "all" is ingest and worker in one process. An SQLite store
# takes one ingest and one worker, whether they share a process or not.
StoreSide = Literal["all", "ingest", "worker"]


class StoreUnavailable(Exception):
    """The store cannot take a write now (read-only, disk full, locked, closed): the caller should retry."""


class UnknownAlert(LookupError):
    """No alert episode has this key (never seen, or pruned)."""


@dataclass(frozen=True)
class IngestResult:
    accepted: bool
    duplicate: bool
    notification_id: int | None = None


@dataclass(frozen=True)
class IncomingNotification:
    idempotency_key: str
    group_key: str
    receiver: str
    body: bytes
    alert_count: int
    # The body as ingest validated it: dedup in the same process uses it instead of parsing the body again.
    payload: WebhookPayload | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class EventRecord:
    """One event of an alert as the store keeps it (state: pending, routed or failed)."""

    id: int
    alert_key: str
    kind: EventKind
    state: str
    created_at: datetime
    attempts: int
    error: str | None


@dataclass(frozen=True)
class StoreStats:
    notifications_pending: int
    notifications_failed: int
    events_pending: int
    events_failed: int
    deliveries_pending: int
    deliveries_failed: int
    alerts_firing: int
    alerts_resolved: int


class Planner(Protocol):
    """(what the store knows of the notification's alerts, its alerts, its groupKey, the store's time now) -> one
    decision per alert."""

    def __call__(
        self, known: Mapping[str, AlertState], alerts: Sequence[AmAlert], group_key: str, *, now: datetime
    ) -> list[AlertDecision]: ...


@dataclass(frozen=True)
class SchemaChange:
    """What opening the store did to its schema: the version it found (0: none yet, a new store) and the one it
    left it at (`gpu-alert-bot migrate` says both)."""

    found: int
    now: int


class Store(abc.ABC):
    # Set by a store opened for writing; a read-only one never changes its schema.
    schema: SchemaChange = SchemaChange(0, 0)

    # --- ingest: the only call on the webhook's hot path -------------------------------------------
    @abc.abstractmethod
    async def ingest(self, notification: IncomingNotification) -> IngestResult:
        """Durably record a notification unless it is a copy seen within the dedup window.

        Returns only after the write is on disk; raises StoreUnavailable when it cannot write. A copy is a
        notification with the same idempotency key accepted less than `dedup_window` ago.
        """

    # --- worker: notifications -> events ------------------------------------------------------------
    @abc.abstractmethod
    async def dedup_pending(self, planner: Planner, limit: int) -> int:
        """Apply up to `limit` pending notifications to the alert records: each one's alert updates, the events
        the planner decides and its "done" mark are written together or not at all, so every event is decided
        exactly once even across a crash. A notification that cannot be applied is set aside as failed.
        Returns how many notifications were taken."""

    @abc.abstractmethod
    async def claim_events(self, limit: int, lease_seconds: float) -> list[Event]:
        """Lease pending events whose previous lease (if any) has expired, oldest first."""

    @abc.abstractmethod
    async def route_events(self, routes: Sequence[EventRoute], incidents: Sequence[IncidentRoute] = ()) -> None:
        """In one transaction, for each of a batch's events: keep its enrichment with the alert, queue its
        deliveries, mark it done; and for each incident that changed, queue its new version's deliveries on an
        event of its own."""

    # --- incidents (bot/incident/) -----------------------------------------------------------------
    @abc.abstractmethod
    async def attribute_incidents(
        self, arrivals: Sequence[IncidentArrival], rule: IncidentRule
    ) -> dict[str, Membership]:
        """In one transaction: the incident each arriving alert belongs to (by its key; none: alone), opening and
        joining incidents as `bot.incident.membership` says."""

    @abc.abstractmethod
    async def advance_incidents(self, changes: Mapping[str, IncidentAdvance]) -> list[IncidentRecord]:
        """In one transaction, for each incident id: a new version, its analysis kept when one is given (None keeps
        the one it has), the receivers added to those told of it, its state from its alerts' (resolved when none
        fires, open again when one does). Returns the records at their new versions."""

    @abc.abstractmethod
    async def incidents_to_settle(self, quiet: float) -> list[str]:
        """The open incidents that gained a host since their last analysis, and none for `quiet` seconds."""

    @abc.abstractmethod
    async def incident_analysis_tried(self, incident_id: str) -> None:
        """Its analysis was tried now (it failed): not due to settle again until a host joins."""

    @abc.abstractmethod
    async def get_incident(self, incident_id: str) -> IncidentRecord | None:
        """The incident with its members folded by host (read one row at a time)."""

    @abc.abstractmethod
    async def incident_alerts(self, incident_id: str) -> list[AlertLine]:
        """Each alert of the incident as a line, in the order they joined (none: no such incident)."""

    @abc.abstractmethod
    async def incident_origins(self, incident_id: str, labels: Sequence[str]) -> list[Origin]:
        """The distinct (values of `labels`, generatorURL) of the incident's alerts: which sites they come from."""

    @abc.abstractmethod
    async def alert_incident(self, alert_key: str) -> str | None:
        """The id of the incident the alert episode is a member of, if any."""

    # --- the incident pages (bot/pages/): reads only, bounded ------------------------------------------
    @abc.abstractmethod
    async def incident_heads(self, limit: int, incident_id: str | None = None) -> list[IncidentHead]:
        """The open incidents first, then the most recent, at most `limit`, without their members (only the one
        named by `incident_id` when given)."""

    @abc.abstractmethod
    async def incident_alert_page(self, incident_id: str, query: AlertQuery) -> AlertPage:
        """One page of the incident's alerts, without their evidence, filtered and sorted by the store."""

    @abc.abstractmethod
    async def fail_event(self, event_id: int, error: str, retry_in: float | None) -> None:
        """Record a processing error; retry after `retry_in` seconds, or give up when it is None."""

    # --- outbox --------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def due_deliveries(self, receiver: str, limit: int, lane: Lane = "alerts") -> list[Delivery]:
        """Pending deliveries of one receiver's lane whose next attempt is due, in the order they were queued: an
        alert's after its earlier ones, an incident's newest version only."""

    @abc.abstractmethod
    async def delivery_succeeded(self, delivery_id: int) -> None: ...

    @abc.abstractmethod
    async def delivery_retry(self, delivery_id: int, error: str, next_attempt_at: datetime) -> None: ...

    @abc.abstractmethod
    async def delivery_failed(self, delivery_id: int, error: str) -> None: ...

    @abc.abstractmethod
    async def next_delivery_due(self, receiver: str, lane: Lane = "alerts") -> datetime | None:
        """When the earliest pending delivery of this receiver's lane is due, or None when there is none."""

    @abc.abstractmethod
    async def supersede_deliveries(self, delivery: Delivery) -> int:
        """Set aside the pending deliveries of the same incident and receiver older than this one (it carries the
        whole view): returns how many."""

    @abc.abstractmethod
    async def delivery_held(self, delivery: Delivery, until: datetime, reason: str) -> None:
        """The sink chose to send this later: no attempt is counted; newer versions of an incident wait as long."""

    # --- what sinks remember about a conversation (Slack ts, email Message-ID, incident cards) --------
    @abc.abstractmethod
    async def get_sink_state(self, receiver: str, key: str) -> dict[str, Any] | None: ...

    async def put_sink_state(self, receiver: str, key: str, value: dict[str, Any]) -> None:
        await self.put_sink_states(receiver, {key: value})

    @abc.abstractmethod
    async def put_sink_states(self, receiver: str, values: Mapping[str, dict[str, Any]]) -> None:
        """Write several keys of one receiver's state in one transaction: all of them or none."""

    @property
    def receivers_move(self) -> bool:
        """Whether a receiver can pass to another process while this one runs (replicas sharing the store): a
        sink then cannot trust what it remembers of its state and reads the store each time."""
        return False

    # --- alerts --------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def get_alert(self, key: str) -> AlertState | None: ...

    @abc.abstractmethod
    async def list_alerts(self, status: str | None = None, limit: int = 100, evidence: bool = True) -> list[AlertState]:
        """The most recently seen alerts (of `status`); `evidence=False` leaves out their enrichment, which a
        caller reading thousands of them does not need."""

    @abc.abstractmethod
    async def alert_by_short_id(self, short_id: str) -> AlertState | None:
        """The alert episode whose `bot.models.short_id` this is (case and surrounding blanks ignored)."""

    @abc.abstractmethod
    async def add_note(self, alert_key: str, text: str) -> int:
        """Queue a NOTE event carrying `text` for a known alert and return its id; it is routed and delivered
        like the alert's other events, into the alert's conversation. Raises UnknownAlert for an unknown key."""

    @abc.abstractmethod
    async def ack(self, alert_key: str, by: str, at: datetime) -> bool:
        """Acknowledge a firing, unacknowledged episode and queue its ACK event, together; False when there was
        nothing to do (resolved, or acknowledged already). Raises UnknownAlert for an unknown key."""

    @abc.abstractmethod
    async def unack(self, alert_key: str, note: str) -> bool:
        """Withdraw an acknowledgement and queue `note` about it, together; False when it was not acknowledged."""

    @abc.abstractmethod
    async def set_silence(
        self, alert_key: str, silence_id: str | None, by: str | None, until: datetime | None, note: str
    ) -> int:
        """Remember (or, with None, forget) the episode's Alertmanager silence and queue `note` about it, together;
        returns the note's event id. Raises UnknownAlert for an unknown key."""

    @abc.abstractmethod
    async def claim_silence(self, alert_key: str, by: str, at: datetime, stale_before: datetime) -> bool:
        """Take the firing episode's silence slot for `by` at `at`, atomically (across replicas too): False when
        it is silenced already, or another request holds the slot since `stale_before` or later. The taker then
        calls `set_silence` with the silence it made, or `release_silence` with the same `at` when it made none.
        Raises UnknownAlert for an unknown key."""

    @abc.abstractmethod
    async def release_silence(self, alert_key: str, claimed_at: datetime) -> None:
        """Give back a slot taken by `claim_silence` at `claimed_at` that got no silence; nothing if not held."""

    @abc.abstractmethod
    async def silenced_alerts(self) -> list[AlertState]:
        """Episodes with a silence the bot set and still believes active, for the periodic check."""

    @abc.abstractmethod
    async def alert_events(self, key: str) -> list[EventRecord]:
        """Every event of one alert episode, oldest first: its history, and proof that each was decided once."""

    @abc.abstractmethod
    async def recent_alerts(self, alertnames: Sequence[str], since: datetime) -> list[AlertState]:
        """Alerts with one of these names seen (first or last) since the given time, newest first."""

    @abc.abstractmethod
    async def alert_deliveries(self, key: str) -> list[DeliveryRecord]:
        """Every delivery of one alert episode, oldest first (the self-test follows its alert with it)."""

    # --- GPU history, for recurrence ---------------------------------------------------------------
    @abc.abstractmethod
    async def record_gpu_events(self, events: Sequence[GpuEvent]) -> None:
        """Remember what happened to which GPU; recording the same event twice keeps one."""

    @abc.abstractmethod
    async def gpu_events(
        self, since: datetime, gpu_key: str | None = None, kind: str | None = None, code: str | None = None
    ) -> list[GpuEvent]: ...

    @abc.abstractmethod
    async def record_and_read_gpu_events(
        self, events: Sequence[GpuEvent], since: datetime, gpu_keys: Sequence[str]
    ) -> list[GpuEvent]:
        """Record `events` as record_gpu_events does, then return the events since `since` under any of `gpu_keys`,
        oldest first: what recurrence needs for one alert in one round trip."""

    @abc.abstractmethod
    async def record_and_read_gpu_histories(self, requests: Sequence[GpuHistoryRequest]) -> list[list[GpuEvent]]:
        """`record_and_read_gpu_events` for each request in turn (each sees what the ones before it recorded, none
        what the ones after it record), all in one transaction: the alerts of a batch in one round trip."""

    # --- audit log ------------------------------------------------------------------------------------
    @abc.abstractmethod
    async def record_audit(self, entry: AuditEntry) -> None:
        """Append to the audit log (durably: it is written before the person is told the outcome)."""

    @abc.abstractmethod
    async def audit_log(self, since: datetime, limit: int = 1000) -> list[AuditEntry]:
        """Audit entries at or after `since`, oldest first, at most `limit` (the newest ones)."""

    # --- dead man's switch (bot/deadman.py) -----------------------------------------------------------
    @abc.abstractmethod
    async def watchdog_seen(self, replicas: Sequence[str], at: datetime) -> None:
        """A Watchdog arrived now from these replicas: restart their timers (creating them if new)."""

    @abc.abstractmethod
    async def watchdog_start(self, replica: str, at: datetime) -> None:
        """Start a timer at `at` unless it exists already (a restart keeps the running one)."""

    @abc.abstractmethod
    async def watchdog_records(self) -> list[WatchdogRecord]: ...

    @abc.abstractmethod
    async def watchdog_shift(self, seconds: float) -> None:
        """Move every timer that is not alerting on by `seconds` (the time the bot itself was down)."""

    @abc.abstractmethod
    async def watchdog_alerting(self, replica: str, since: datetime | None) -> None:
        """Record that the switch now alerts for this replica (since the given time), or no longer (None)."""

    # --- remediation: action runs and the circuit breaker ---------------------------------------------
    @abc.abstractmethod
    async def add_action_run(self, run: ActionRun) -> ActionRun:
        """Persist a new run (its `id` is ignored) and return it with the id the store gave it."""

    @abc.abstractmethod
    async def get_action_run(self, run_id: int) -> ActionRun | None: ...

    @abc.abstractmethod
    async def transition_action_run(
        self,
        run_id: int,
        expected: str,
        state: str,
        at: datetime,
        detail: str | None = None,
        approvals: Sequence[str] | None = None,
    ) -> ActionRun | None:
        """Move a run from state `expected` to `state` (with a new detail or approvals), atomically: None when
        the run is not in `expected` any more (someone else moved it first)."""

    @abc.abstractmethod
    async def action_runs(self, since: datetime, states: Sequence[str] | None = None) -> list[ActionRun]:
        """Runs updated at or after `since` (in one of `states` when given), oldest first."""

    @abc.abstractmethod
    async def get_breaker(self) -> BreakerState | None:
        """The circuit breaker's state: None when closed."""

    @abc.abstractmethod
    async def set_breaker(self, state: BreakerState | None) -> None:
        """Open (a state) or close (None) the circuit breaker, durably."""

    @abc.abstractmethod
    async def reset_breaker(self, at: datetime) -> None:
        """Close the circuit breaker and start its counting window at `at`, together: automatic runs requested
        before a reset no longer count towards opening it again."""

    @abc.abstractmethod
    async def breaker_window_start(self) -> datetime | None:
        """When the breaker was last reset (its window counts from then at the earliest); None if never."""

    # --- health and housekeeping ---------------------------------------------------------------------
    @abc.abstractmethod
    async def check_writable(self) -> None:
        """Raise StoreUnavailable unless the store can take a write of a typical notification now."""

    @abc.abstractmethod
    async def stats(self) -> StoreStats: ...

    @abc.abstractmethod
    async def prune(self, older_than: datetime) -> int:
        """Delete finished notifications, events and deliveries, alerts resolved, sink state not touched, GPU
        history and audit entries older than the given time. Firing alerts are kept however old."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    # --- store copy (core.COPIED_TABLES names the tables and columns) -----------------------------------
    @abc.abstractmethod
    async def export_rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of one of the tables `store copy` moves, as column -> stored value."""

    @abc.abstractmethod
    async def import_rows(self, table: str, rows: Sequence[Mapping[str, Any]]) -> int:
        """Insert rows exported by any backend, in one transaction; a row the store already has is kept as it is.
        Returns how many were inserted."""

    @abc.abstractmethod
    async def running_bots(self) -> list[str]:
        """The bot processes other than this one using the store now, as people name them (`store copy` warns
        that a source still in use keeps changing under it); empty when none."""

    # --- several replicas on one store (PostgreSQL); a single-process store has nobody to share with ------
    async def hold_receiver(self, receiver: str, lease_seconds: float) -> bool:
        """Take, or renew, this process's lease on dispatching one receiver; False while another replica holds
        it. One dispatcher per receiver keeps Slack pacing, incident cards and threads single-writer."""
        return True

    async def release_receiver(self, receiver: str) -> None:  # noqa: B027
        """Give the receiver up (at shutdown), so another replica takes it over without waiting for the lease."""

    def subscribe(self, on_work: Callable[[], None], on_deliveries: Callable[[str], None]) -> None:  # noqa: B027
        """Be told when another replica stored notifications or events (`on_work`) or queued deliveries for a
        receiver (`on_deliveries`). Polling stays the fallback; a single-process store never calls them."""

"""What the store hands back about people's requests and the bot's own state: audit entries, deliveries, the dead
man's switch's timers, remediation runs and the circuit breaker (bot/storage/interface.py's `Store` returns them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from bot.models import EventKind


@dataclass(frozen=True)
class AuditEntry:
    """One thing a person (or the bot on its own) asked for, and what came of it: a Slack command or click, an
    approval, a remediation step. `actor` says who (`slack:U024BE7LH alice`, `cli:root`, `bot`), `action` what
    (`ack`, `silence`, `run restart-dcgm-exporter`), `target` on what (an alert's short id, a silence id),
    `outcome` a short stable word (`done`, `refused`, `failed`, `dry-run`, ...)."""

    at: datetime
    actor: str
    action: str
    target: str
    outcome: str
    detail: str = ""


@dataclass(frozen=True)
class DeliveryRecord:
    """One delivery of an alert as the outbox keeps it: which event, to which receiver, and how it went
    (state: pending, delivered or failed)."""

    event_kind: EventKind
    receiver: str
    state: str
    attempts: int
    error: str | None


@dataclass(frozen=True)
class WatchdogRecord:
    """The dead man's switch's timer for one Alertmanager replica (its externalURL): when its Watchdog last
    arrived, and since when the bot has been saying it is missing (None: not alerting)."""

    replica: str
    last_seen: datetime
    alerted_since: datetime | None = None


@dataclass(frozen=True)
class ActionRun:
    """One remediation action asked for on one alert's target, as persisted: its state moves requested ->
    approved -> running -> done/failed -> verified/escalated (or refused, expired, dry-run), each step written
    before the next begins, so a restart neither loses nor repeats it."""

    id: int
    action: str
    alert_key: str
    target: str
    gpu: str | None
    requested_by: str
    automatic: bool
    dry_run: bool
    state: str
    requested_at: datetime
    updated_at: datetime
    approvals: tuple[str, ...] = ()
    detail: str = ""


@dataclass(frozen=True)
class BreakerState:
    """The remediation circuit breaker, open: automatic actions stop until an admin resets it."""

    opened_at: datetime
    reason: str

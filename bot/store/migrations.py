"""Schema versions of both backends, applied at start (or by `gpu-alert-bot migrate`).

Each backend keeps the version its schema is at; a store at a newer version than this code knows was written
by a newer bot, and this one refuses to run against it rather than misread it. To change the schema, append a
migration to POSTGRESQL_MIGRATIONS (and bump SQLITE_SCHEMA_VERSION with the SQLite change): never edit one that
has shipped.
"""

from __future__ import annotations

from bot.storage.interface import StoreUnavailable

# 2: the webhooks and their idempotency keys are written to an inbox file of their own (bot/store/sqlite/inbox.py).
# 3: alerts.silence_claimed_at (one silence per alert) and remediation_breaker_window (a reset starts a window).
# 4: incidents and their members (bot/incident/).
# 5: incidents gather alerts of any alertname on their hosts (their members' hosts, gathered alertnames, receivers).
SQLITE_SCHEMA_VERSION = 5


class SchemaTooNew(StoreUnavailable):
    """The store was migrated by a newer version of the bot."""


def refuse_newer(found: int, known: int, where: str) -> None:
    if found > known:
        raise SchemaTooNew(
            f"{where} has schema version {found}, newer than this gpu-alert-bot knows ({known}): "
            "run the newer version, or restore a backup taken before it migrated"
        )


# (version, statements). Columns mirror the SQLite schema (timestamps as epoch seconds, JSON as text), so
# the shared core reads rows of both alike and `store copy` copies rows as they are.
POSTGRESQL_MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
CREATE TABLE notification_keys (
    key TEXT PRIMARY KEY,
    group_key TEXT NOT NULL,
    accepted_at DOUBLE PRECISION NOT NULL,
    last_received_at DOUBLE PRECISION NOT NULL,
    duplicates INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX notification_keys_accepted ON notification_keys(accepted_at);

CREATE TABLE group_resolves (
    group_key TEXT PRIMARY KEY,
    resolved_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE notifications (
    id BIGSERIAL PRIMARY KEY,
    received_at DOUBLE PRECISION NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    body BYTEA NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    error TEXT
);
CREATE INDEX notifications_pending ON notifications(id) WHERE state = 'pending';
CREATE INDEX notifications_failed ON notifications(id) WHERE state = 'failed';

CREATE TABLE alerts (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    alertname TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    starts_at DOUBLE PRECISION NOT NULL,
    ends_at DOUBLE PRECISION,
    generator_url TEXT NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    external_url TEXT NOT NULL,
    first_seen DOUBLE PRECISION NOT NULL,
    last_seen DOUBLE PRECISION NOT NULL,
    times_seen INTEGER NOT NULL,
    resolved_at DOUBLE PRECISION,
    acked_by TEXT,
    acked_at DOUBLE PRECISION,
    enrichment TEXT
);
CREATE INDEX alerts_status ON alerts(status, last_seen);
CREATE INDEX alerts_name ON alerts(alertname, last_seen);

CREATE TABLE events (
    id BIGSERIAL PRIMARY KEY,
    alert_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE INDEX events_pending ON events(id) WHERE state = 'pending';
CREATE INDEX events_failed ON events(id) WHERE state = 'failed';
CREATE INDEX events_alert ON events(alert_key);
CREATE INDEX events_alert_pending ON events(alert_key, id) WHERE state = 'pending';

CREATE TABLE deliveries (
    id BIGSERIAL PRIMARY KEY,
    event_id BIGINT NOT NULL,
    alert_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    message TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    error TEXT,
    UNIQUE (event_id, receiver)
);
CREATE INDEX deliveries_pending ON deliveries(receiver, alert_key, id) WHERE state = 'pending';
CREATE INDEX deliveries_due ON deliveries(receiver, id) WHERE state = 'pending';
CREATE INDEX deliveries_failed ON deliveries(id) WHERE state = 'failed';

CREATE TABLE sink_state (
    receiver TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (receiver, key)
);

CREATE TABLE gpu_events (
    id BIGSERIAL PRIMARY KEY,
    gpu_key TEXT NOT NULL,
    host TEXT NOT NULL,
    pci_bus_id TEXT NOT NULL,
    uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    code TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    alert_key TEXT NOT NULL,
    UNIQUE (gpu_key, kind, code, at, alert_key)
);
CREATE INDEX gpu_events_at ON gpu_events(at);

CREATE TABLE audit_log (
    id BIGSERIAL PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX audit_log_at ON audit_log(at);

-- One replica at a time dispatches each receiver: Slack pacing, storm summaries and threads stay single-writer.
CREATE TABLE receiver_leases (
    receiver TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    until DOUBLE PRECISION NOT NULL
);

CREATE TABLE heartbeat (
    replica TEXT PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL
);
""",
    ),
]
POSTGRESQL_MIGRATIONS.append(
    (
        2,
        """
-- The text of NOTE events, one row per note.
CREATE TABLE event_notes (
    event_id BIGINT PRIMARY KEY,
    text TEXT NOT NULL
);

-- The short id people type for an alert episode (bot.models.short_id); the first episode keeps a rare clash.
CREATE TABLE alert_short_ids (
    short_id TEXT PRIMARY KEY,
    alert_key TEXT NOT NULL
);
CREATE INDEX alert_short_ids_key ON alert_short_ids(alert_key);
""",
    )
)
POSTGRESQL_MIGRATIONS.append(
    (
        3,
        """
-- The Alertmanager silence the bot set on an episode from Slack, and until when it believes it active.
ALTER TABLE alerts ADD COLUMN silence_id TEXT;
ALTER TABLE alerts ADD COLUMN silenced_by TEXT;
ALTER TABLE alerts ADD COLUMN silenced_until DOUBLE PRECISION;
CREATE INDEX alerts_silenced ON alerts(key) WHERE silence_id IS NOT NULL;

-- The dead man's switch: when each Alertmanager replica's Watchdog last arrived, and whether the bot alerts.
CREATE TABLE watchdog (
    replica TEXT PRIMARY KEY,
    last_seen DOUBLE PRECISION NOT NULL,
    alerted_since DOUBLE PRECISION
);

-- Remediation: each action run, moved from state to state by compare-and-set.
CREATE TABLE action_runs (
    id BIGSERIAL PRIMARY KEY,
    action TEXT NOT NULL,
    alert_key TEXT NOT NULL,
    target TEXT NOT NULL,
    gpu TEXT,
    requested_by TEXT NOT NULL,
    automatic INTEGER NOT NULL,
    dry_run INTEGER NOT NULL,
    state TEXT NOT NULL,
    requested_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    approvals TEXT NOT NULL DEFAULT '[]',
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX action_runs_updated_at ON action_runs(updated_at);

CREATE TABLE remediation_breaker (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    opened_at DOUBLE PRECISION NOT NULL,
    reason TEXT NOT NULL
);
""",
    )
)
POSTGRESQL_MIGRATIONS.append(
    (
        4,
        """
-- When a Slack request took the episode's silence slot (one silence per alert), until it set the silence.
ALTER TABLE alerts ADD COLUMN silence_claimed_at DOUBLE PRECISION;

-- Since when the circuit breaker counts automatic runs: its last reset (none: since ever).
CREATE TABLE remediation_breaker_window (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    since DOUBLE PRECISION NOT NULL
);
""",
    )
)
POSTGRESQL_MIGRATIONS.append(
    (
        5,
        """
-- Incidents (bot/incident/): alerts of one alertname told as one; `analysis` is the incident-level evidence (JSON).
CREATE TABLE incidents (
    id TEXT PRIMARY KEY,
    alertname TEXT NOT NULL,
    playbook TEXT NOT NULL,
    state TEXT NOT NULL,
    opened_at DOUBLE PRECISION NOT NULL,
    last_joined_at DOUBLE PRECISION NOT NULL,
    resolved_at DOUBLE PRECISION,
    version INTEGER NOT NULL DEFAULT 0,
    analysis TEXT
);
CREATE INDEX incidents_open ON incidents(alertname) WHERE state = 'open';
CREATE INDEX incidents_opened ON incidents(opened_at);

-- An incident's alerts; `alone`: told on its own before the incident opened (it keeps its own messages).
CREATE TABLE incident_members (
    alert_key TEXT PRIMARY KEY,
    incident_id TEXT NOT NULL,
    joined_at DOUBLE PRECISION NOT NULL,
    alone INTEGER NOT NULL
);
CREATE INDEX incident_members_incident ON incident_members(incident_id);
""",
    )
)
POSTGRESQL_MIGRATIONS.append(
    (
        6,
        """
-- Incidents gather alerts of any alertname on their hosts: the host of each member, the alertnames an incident takes
-- on new hosts (each gathers its own, as before), whether it stands apart, when a host last joined, its last
-- analysis, and the receivers told of it.
ALTER TABLE incident_members ADD COLUMN host TEXT NOT NULL DEFAULT '';
CREATE INDEX incident_members_host ON incident_members(host);
ALTER TABLE incidents ADD COLUMN gathers TEXT NOT NULL DEFAULT '[]';
ALTER TABLE incidents ADD COLUMN apart INTEGER NOT NULL DEFAULT 0;
ALTER TABLE incidents ADD COLUMN grew_at DOUBLE PRECISION;
ALTER TABLE incidents ADD COLUMN analysed_at DOUBLE PRECISION;
ALTER TABLE incidents ADD COLUMN receivers TEXT NOT NULL DEFAULT '[]';
UPDATE incidents SET gathers = json_build_array(alertname)::text,
       receivers = (SELECT COALESCE(json_agg(DISTINCT d.receiver), '[]'::json)::text FROM deliveries d
                     WHERE d.alert_key = 'incident:' || incidents.id);
""",
    )
)
POSTGRESQL_SCHEMA_VERSION = POSTGRESQL_MIGRATIONS[-1][0]

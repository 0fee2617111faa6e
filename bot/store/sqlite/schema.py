"""The SQLite store's schema, the soundness check of an existing file, and the columns and rows added to a
store written by an earlier version."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bot.models import short_id
from bot.storage.interface import StoreUnavailable

_SCHEMA = """
-- When an alert of the group last resolved: a notification accepted before that is no copy of one sent after
-- it, even if identical (the same alert firing again, with the same start).
CREATE TABLE IF NOT EXISTS group_resolves (
    group_key TEXT PRIMARY KEY,
    resolved_at REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS notifications (
    id INTEGER PRIMARY KEY,
    received_at REAL NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    body BLOB NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    error TEXT
);
CREATE INDEX IF NOT EXISTS notifications_pending ON notifications(id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS notifications_failed ON notifications(id) WHERE state = 'failed';

-- The last id the worker copied from the inbox file (bot/store/sqlite/inbox.py) into notifications.
CREATE TABLE IF NOT EXISTS inbox_taken (
    only INTEGER PRIMARY KEY CHECK (only = 1),
    up_to INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS alerts (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    alertname TEXT NOT NULL,
    status TEXT NOT NULL,
    labels TEXT NOT NULL,
    annotations TEXT NOT NULL,
    starts_at REAL NOT NULL,
    ends_at REAL,
    generator_url TEXT NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    external_url TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    times_seen INTEGER NOT NULL,
    resolved_at REAL,
    acked_by TEXT,
    acked_at REAL,
    enrichment TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS alerts_status ON alerts(status, last_seen);
CREATE INDEX IF NOT EXISTS alerts_name ON alerts(alertname, last_seen);

CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    alert_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    lease_until REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE INDEX IF NOT EXISTS events_pending ON events(id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS events_failed ON events(id) WHERE state = 'failed';
CREATE INDEX IF NOT EXISTS events_alert ON events(alert_key);
CREATE INDEX IF NOT EXISTS events_alert_pending ON events(alert_key, id) WHERE state = 'pending';

CREATE TABLE IF NOT EXISTS deliveries (
    id INTEGER PRIMARY KEY,
    event_id INTEGER NOT NULL,
    alert_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    message TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    error TEXT,
    UNIQUE (event_id, receiver)
);
CREATE INDEX IF NOT EXISTS deliveries_pending ON deliveries(receiver, alert_key, id) WHERE state = 'pending';
-- Walks a receiver's queue in order and stops at the batch size, however long the backlog.
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries(receiver, id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS deliveries_failed ON deliveries(id) WHERE state = 'failed';

CREATE TABLE IF NOT EXISTS sink_state (
    receiver TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (receiver, key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS gpu_events (
    id INTEGER PRIMARY KEY,
    gpu_key TEXT NOT NULL,
    host TEXT NOT NULL,
    pci_bus_id TEXT NOT NULL,
    uuid TEXT NOT NULL,
    kind TEXT NOT NULL,
    code TEXT NOT NULL,
    at REAL NOT NULL,
    alert_key TEXT NOT NULL,
    UNIQUE (gpu_key, kind, code, at, alert_key)
);
CREATE INDEX IF NOT EXISTS gpu_events_at ON gpu_events(at);

CREATE TABLE IF NOT EXISTS audit_log (
    id INTEGER PRIMARY KEY,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    outcome TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log(at);

CREATE TABLE IF NOT EXISTS action_runs (
    id INTEGER PRIMARY KEY,
    action TEXT NOT NULL,
    alert_key TEXT NOT NULL,
    target TEXT NOT NULL,
    gpu TEXT,
    requested_by TEXT NOT NULL,
    automatic INTEGER NOT NULL,
    dry_run INTEGER NOT NULL,
    state TEXT NOT NULL,
    requested_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    approvals TEXT NOT NULL DEFAULT '[]',
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS action_runs_updated_at ON action_runs(updated_at);

CREATE TABLE IF NOT EXISTS remediation_breaker (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    opened_at REAL NOT NULL,
    reason TEXT NOT NULL
);

-- Since when the circuit breaker counts automatic runs: its last reset (none: since ever).
CREATE TABLE IF NOT EXISTS remediation_breaker_window (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    since REAL NOT NULL
);

-- The text of NOTE events, one row per note.
CREATE TABLE IF NOT EXISTS event_notes (
    event_id INTEGER PRIMARY KEY,
    text TEXT NOT NULL
);

-- The short id people type for an alert episode (bot.models.short_id); the first episode keeps a rare clash.
CREATE TABLE IF NOT EXISTS alert_short_ids (
    short_id TEXT PRIMARY KEY,
    alert_key TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS alert_short_ids_key ON alert_short_ids(alert_key);

-- The dead man's switch: when each Alertmanager replica's Watchdog last arrived, and whether the bot alerts.
CREATE TABLE IF NOT EXISTS watchdog (
    replica TEXT PRIMARY KEY,
    last_seen REAL NOT NULL,
    alerted_since REAL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at REAL NOT NULL
);

-- Incidents (bot/incident/): one cause seen as alerts on a set of hosts; `analysis` is the incident-level evidence
-- (JSON); `gathers`: the alertnames it takes on new hosts (JSON); `apart`: opened by alerts that stand apart (it
-- gathers by alertname only); `grew_at`: when a host last joined; `analysed_at`: its last analysis; `receivers`:
-- those told of it (JSON).
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    alertname TEXT NOT NULL,
    playbook TEXT NOT NULL,
    state TEXT NOT NULL,
    opened_at REAL NOT NULL,
    last_joined_at REAL NOT NULL,
    resolved_at REAL,
    version INTEGER NOT NULL DEFAULT 0,
    analysis TEXT,
    gathers TEXT NOT NULL DEFAULT '[]',
    apart INTEGER NOT NULL DEFAULT 0,
    grew_at REAL,
    analysed_at REAL,
    receivers TEXT NOT NULL DEFAULT '[]'
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS incidents_open ON incidents(alertname) WHERE state = 'open';
CREATE INDEX IF NOT EXISTS incidents_opened ON incidents(opened_at);

-- An incident's alerts; `alone`: told on its own before the incident opened (it keeps its own messages); `host`:
-- the host it names.
CREATE TABLE IF NOT EXISTS incident_members (
    alert_key TEXT PRIMARY KEY,
    incident_id TEXT NOT NULL,
    joined_at REAL NOT NULL,
    alone INTEGER NOT NULL,
    host TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS incident_members_incident ON incident_members(incident_id);

CREATE TABLE IF NOT EXISTS write_probe (
    data BLOB NOT NULL
);
"""


class StoreDamaged(StoreUnavailable):
    """The store file is not a sound SQLite database: starting on it would lose or invent work silently."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"the store {path} is damaged ({problem}): stop the bot, move {path} and its -wal/-shm files aside "
            "(or restore a backup) and start again; acknowledged work in the damaged file is not delivered"
        )


def _check_sound(conn: sqlite3.Connection, path: Path) -> None:
    """Raise StoreDamaged unless SQLite reads the whole file as a sound database (PRAGMA quick_check)."""
    try:
        problems = [str(row[0]).replace("\n", "; ") for row in conn.execute("PRAGMA quick_check(3)").fetchall()]
    except sqlite3.OperationalError:
        raise  # the disk or a lock, not the file's content
    except sqlite3.DatabaseError as exc:  # SQLITE_NOTADB, SQLITE_CORRUPT
        raise StoreDamaged(path, str(exc)) from exc
    if problems != ["ok"]:
        raise StoreDamaged(path, "; ".join(problems))


# Columns added after the first release: added to an existing store on open.
_ALERT_SILENCE_COLUMNS = {
    "silence_id": "TEXT",
    "silenced_by": "TEXT",
    "silenced_until": "REAL",
    "silence_claimed_at": "REAL",
}


def _add_missing_columns(conn: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    present = {row["name"] for row in conn.execute(f"PRAGMA table_info({table})")}
    for name, sql_type in columns.items():
        if name not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {sql_type}")


# Incidents of a store written before they gathered several alertnames on their hosts.
_INCIDENT_COLUMNS = {
    "gathers": "TEXT NOT NULL DEFAULT '[]'",
    "apart": "INTEGER NOT NULL DEFAULT 0",
    "grew_at": "REAL",
    "analysed_at": "REAL",
    "receivers": "TEXT NOT NULL DEFAULT '[]'",
}


def upgrade_incidents(conn: sqlite3.Connection) -> None:
    """Give an older store's incidents what the membership rule reads: each gathers its own alertname, as before,
    and goes on to the receivers that had its versions."""
    present = {row["name"] for row in conn.execute("PRAGMA table_info(incidents)")}
    if "receivers" not in present:
        _add_missing_columns(conn, "incidents", _INCIDENT_COLUMNS)
        _add_missing_columns(conn, "incident_members", {"host": "TEXT NOT NULL DEFAULT ''"})
        conn.execute("UPDATE incidents SET gathers = json_array(alertname)")
        conn.execute(
            """UPDATE incidents SET receivers = (SELECT json_group_array(DISTINCT d.receiver) FROM deliveries d
                                                 WHERE d.alert_key = 'incident:' || incidents.id)"""
        )
    conn.execute("CREATE INDEX IF NOT EXISTS incident_members_host ON incident_members(host)")


def _add_missing_short_ids(conn: sqlite3.Connection) -> None:
    """Short ids for alerts stored by a version that had none."""
    keys = conn.execute(
        "SELECT key FROM alerts a WHERE NOT EXISTS (SELECT 1 FROM alert_short_ids s WHERE s.alert_key = a.key)"
    ).fetchall()
    if keys:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT OR IGNORE INTO alert_short_ids (short_id, alert_key) VALUES (?, ?)",
            [(short_id(row["key"]), row["key"]) for row in keys],
        )
        conn.execute("COMMIT")

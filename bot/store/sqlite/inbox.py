"""The inbox: the webhooks acknowledged and not yet taken by the worker, in a SQLite file of their own.

SQLite lets one connection write a file at a time, and the worker writes the store's main file most of the time:
a webhook written there waited for the worker's transaction of the moment (on a busy machine, tens of
milliseconds) before it could be acknowledged. The inbox file (`<store>-inbox`) holds the webhooks and the
idempotency keys their answers depend on, and is written by the ingest side:

- the webhook path appends to it (group-committed, fsynced before the 2xx);
- the worker reads it and copies what it takes into the main file's `notifications`, fsynced, where dedup goes
  on as before; it writes the inbox only to forget expired keys, once per prune;
- the inbox's checkpointer (Sweeper) deletes what the main file holds, every second.

The inbox's ids continue the main file's, so a notification keeps one id from its acknowledgement on.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    received_at REAL NOT NULL,
    group_key TEXT NOT NULL,
    receiver TEXT NOT NULL,
    body BLOB NOT NULL
);

CREATE TABLE IF NOT EXISTS notification_keys (
    key TEXT PRIMARY KEY,
    accepted_at REAL NOT NULL,
    last_received_at REAL NOT NULL,
    duplicates INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- Written and rolled back by the readiness probe: is there room for a large notification?
CREATE TABLE IF NOT EXISTS write_probe (data BLOB);
"""
_COLUMNS = "id, received_at, group_key, receiver, body"


def inbox_path(store: Path) -> Path:
    return store.with_name(store.name + "-inbox")


def create(inbox: sqlite3.Connection, main: sqlite3.Connection) -> None:
    """Create the inbox's tables, its ids past every id the main file has given (an inbox made anew beside an
    existing store, or a store written before the inbox, must never give an id twice)."""
    inbox.executescript(_SCHEMA)
    last = max(taken(main), main.execute("SELECT COALESCE(MAX(id), 0) FROM notifications").fetchone()[0])
    inbox.execute("BEGIN IMMEDIATE")
    try:
        row = inbox.execute("SELECT seq FROM sqlite_sequence WHERE name = 'inbox'").fetchone()
        if row is None:
            inbox.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('inbox', ?)", (last,))
        elif row[0] < last:
            inbox.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'inbox'", (last,))
        inbox.execute("COMMIT")
    finally:
        if inbox.in_transaction:
            inbox.execute("ROLLBACK")


def taken(main: sqlite3.Connection) -> int:
    row = main.execute("SELECT up_to FROM inbox_taken").fetchone()
    return 0 if row is None else int(row[0])


def not_taken(inbox: sqlite3.Connection, after: int, limit: int) -> list[sqlite3.Row]:
    rows: list[sqlite3.Row] = inbox.execute(
        f"SELECT {_COLUMNS} FROM inbox WHERE id > ? ORDER BY id LIMIT ?",  # noqa: S608
        (after, limit),
    ).fetchall()
    return rows


def copy_into_main(main: sqlite3.Connection, rows: list[sqlite3.Row]) -> None:
    main.executemany(
        f"INSERT INTO notifications ({_COLUMNS}) VALUES (?, ?, ?, ?, ?)",  # noqa: S608
        [tuple(row) for row in rows],
    )
    main.execute(
        "INSERT INTO inbox_taken (only, up_to) VALUES (1, ?) ON CONFLICT (only) DO UPDATE SET up_to = excluded.up_to",
        (rows[-1]["id"],),
    )


class Sweeper:
    """Deletes from the inbox what the worker took: run every second by the inbox's checkpointer, in the process
    that writes the inbox, so that the worker's busy process never holds the lock a webhook waits for."""

    def __init__(self, store: Path) -> None:
        self._store = store

    def __call__(self, inbox: sqlite3.Connection) -> None:
        if "store" not in {row[1] for row in inbox.execute("PRAGMA database_list")}:
            inbox.execute("ATTACH ? AS store", (str(self._store),))  # only read: no lock on the main file
        # Taken: the worker's copy in the main file is on disk.
        inbox.execute("DELETE FROM inbox WHERE id <= (SELECT COALESCE(MAX(up_to), 0) FROM store.inbox_taken)")


def forget_keys(inbox: sqlite3.Connection, accepted_before: float) -> int:
    return int(inbox.execute("DELETE FROM notification_keys WHERE accepted_at < ?", (accepted_before,)).rowcount)


def waiting(inbox: sqlite3.Connection, main: sqlite3.Connection) -> int:
    return int(inbox.execute("SELECT COUNT(*) FROM inbox WHERE id > ?", (taken(main),)).fetchone()[0])

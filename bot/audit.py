"""The audit log: who asked the bot to do what, and what came of it. Written by the Slack commands and buttons
and by remediation; read by `gpu-alert-bot audit`."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig
from bot.printable import printable
from bot.storage.interface import AuditEntry, Store
from bot.store import StoreUnavailable, open_store

_COLUMNS = ("TIME", "ACTOR", "ACTION", "TARGET", "OUTCOME", "DETAIL")


class AuditLog:
    """Appends entries stamped by the given clock (a fake one in tests)."""

    def __init__(self, store: Store, clock: Clock = SYSTEM_CLOCK) -> None:
        self._store = store
        self._clock = clock

    async def record(self, actor: str, action: str, target: str, outcome: str, detail: str = "") -> AuditEntry:
        entry = AuditEntry(self._clock.now(), actor, action, target, outcome, detail)
        await self._store.record_audit(entry)
        return entry


def format_audit_table(entries: Sequence[AuditEntry]) -> str:
    # Audit fields come from people (Slack text, user names): they must never drive the terminal.
    rows = [_COLUMNS] + [
        (
            entry.at.strftime("%Y-%m-%d %H:%M:%S"),
            *(printable(field) for field in (entry.actor, entry.action, entry.target, entry.outcome, entry.detail)),
        )
        for entry in entries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    )


def audit_json(entry: AuditEntry) -> str:
    fields = {
        "at": entry.at.isoformat(),
        "actor": entry.actor,
        "action": entry.action,
        "target": entry.target,
        "outcome": entry.outcome,
        "detail": entry.detail,
    }
    return json.dumps(fields)  # ASCII: escapes every control character


async def audit_command(config: BotConfig, since_seconds: float, output: str) -> int:
    """`gpu-alert-bot audit`: the audit log from the store, opened read-only (safe beside a running bot)."""
    try:
        store = await open_store(config.store, read_only=True)
    except StoreUnavailable as exc:
        print(f"cannot open the store {config.store.path}: {exc}", file=sys.stderr)
        return 1
    try:
        entries = await store.audit_log(datetime.now(UTC) - timedelta(seconds=since_seconds))
    finally:
        await store.close()
    if output == "json":
        for entry in entries:
            print(audit_json(entry))
    elif entries:
        print(format_audit_table(entries))
    else:
        print("Nothing in the audit log for that period", file=sys.stderr)
    return 0

"""`gpu-alert-bot incidents`: the incidents in the store, the open ones first, then the most recent; and how `report`
finds the incident a person names, by whatever id a message showed them.

A person meets an incident's id on its Slack card, its mail, its PagerDuty summary and the console's line (`id`);
they may as well paste the incident's key (`incident:ID`) or the id of one of its alerts: each names the incident.
The store is opened read-only: safe beside a running bot.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bot.config import BotConfig
from bot.incident.model import INCIDENT_KEY_PREFIX, IncidentView
from bot.incident.record import IncidentRecord
from bot.incident.view import build_view
from bot.message import format_duration
from bot.printable import printable
from bot.storage.interface import Store
from bot.store import StoreUnavailable, open_store

# Incidents listed: every open one comes before any resolved one.
LISTED = 50
# Host names shown per incident; the title says how many there are.
HOSTS_SHOWN = 3
_COLUMNS = ("ID", "STATE", "SINCE", "TITLE", "HOSTS")


class IncidentNotFound(LookupError):
    """No incident goes by the id given; the message says what was tried."""


async def find_incident(store: Store, given: str) -> IncidentRecord:
    """The incident named by its id, its key (`incident:ID`), or the id or key of one of its alerts."""
    text = given.strip()
    if text.lower().startswith(INCIDENT_KEY_PREFIX):
        text = text[len(INCIDENT_KEY_PREFIX) :]
    record = await store.get_incident(text) or await store.get_incident(text.lower())
    if record is not None:
        return record
    alert = await store.alert_by_short_id(text) or await store.get_alert(text)
    if alert is None:
        raise IncidentNotFound(
            f"no incident {given!r} in the store: give the id its card, mail, page or console line shows "
            "(`gpu-alert-bot incidents` lists them)"
        )
    incident_id = await store.alert_incident(alert.key)
    record = None if incident_id is None else await store.get_incident(incident_id)
    if record is None:
        raise IncidentNotFound(f"the alert {given!r} is told on its own, in no incident")
    return record


def incident_row(view: IncidentView) -> tuple[str, ...]:
    """One incident's row: id, state, since, title, its first hosts worst first."""
    state = "open"
    if view.resolved_at is not None:
        state = f"resolved after {format_duration((view.resolved_at - view.opened_at).total_seconds())}"
    hosts = ", ".join(line.host for line in view.hosts[:HOSTS_SHOWN])
    more = len(view.hosts) - HOSTS_SHOWN
    if more > 0:
        hosts += f" and {more:,} more"
    return (view.id, state, f"{view.scope.since:%Y-%m-%d %H:%M} UTC", view.title, hosts)


def incidents_table(records: Sequence[IncidentRecord]) -> str:
    rows = [_COLUMNS, *(tuple(printable(cell) for cell in incident_row(build_view(r))) for r in records)]
    widths = [max(len(row[column]) for row in rows) for column in range(len(_COLUMNS) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]) for row in rows)


async def incidents_command(config: BotConfig) -> int:
    try:
        store = await open_store(config.store, read_only=True)
    except StoreUnavailable as exc:
        print(f"gpu-alert-bot incidents: cannot read the store: {exc}", file=sys.stderr)
        return 1
    try:
        # The pages' list (open ones first, then the most recent), each read whole for its title and hosts.
        heads = await store.incident_heads(LISTED)
        records = [record for head in heads if (record := await store.get_incident(head.id)) is not None]
    finally:
        await store.close()
    if not records:
        print(
            "No incident in the store: alerts are told one by one until more than incidents.threshold of them "
            "arrive together",
            file=sys.stderr,
        )
        return 0
    print(incidents_table(records))
    shown = f"the {LISTED} shown: open ones first, then the most recent; " if len(records) == LISTED else ""
    print(f"{shown}gpu-alert-bot report ID writes an incident's record", file=sys.stderr)
    return 0

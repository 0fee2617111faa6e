"""The SQL both backends run for the incident pages (bot/storage/pages.py says what they ask).

An alert's host and value are not columns: they are derived from its labels (`bot.models.host_from_labels`) and
annotations (`bot.incident.members.alert_value`). SQLite computes them with those same Python functions, registered
on its connection; PostgreSQL with the SQL expressions below, which follow the same rules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bot.incident.members import alert_value
from bot.models import host_from_labels
from bot.storage.pages import AlertQuery, IncidentHead
from bot.store.core import ALERT_WITHOUT_EVIDENCE, Row
from bot.store.incidents import dt


@dataclass(frozen=True)
class Dialect:
    """How a backend writes what the shared SQL needs."""

    placeholder: str
    host: str  # the alert's host, from `a.labels`
    value: str  # the alert's value, from `a.annotations`
    label: str  # one label's value; the parameter is `label_parameter(name)`
    contains: str  # `{text}` holds `{p}`, in any case
    label_path: bool  # True: a label is named by a JSON path ('$."row"'), False: by its name
    # Text sorted by its bytes, as SQLite does, whatever the database's locale.
    text_order: str = ""

    def label_parameter(self, name: str) -> str:
        return f'$."{name}"' if self.label_path else name


# SQLite: Python functions registered on the connection (`register_functions`).
SQLITE = Dialect(
    placeholder="?",
    host="bot_alert_host(a.labels)",
    value="bot_alert_value(a.annotations)",
    label="json_extract(a.labels, ?)",
    contains="instr(lower({text}), lower(?)) > 0",
    label_path=True,
)
_PG_LABEL = "(a.labels::json ->> '{name}')"
_PG_HOST_LABELS = ("host", "Hostname", "hostname", "node")
# host_from_labels: the first label present and not blank, an `instance` without its port ("[::1]:9400" -> "::1",
# "k-ai-01:9400" -> "k-ai-01", "a:b:c" kept).
_PG_HOST = (
    "COALESCE("
    + "".join(f"NULLIF(btrim({_PG_LABEL.format(name=name)}), ''), " for name in _PG_HOST_LABELS)
    + f"NULLIF(regexp_replace(btrim({_PG_LABEL.format(name='instance')}), "
    + r"'^\[([^]]*)\].*$|^([^:]*):([0-9]+)$', '\1\2'), ''), '')"
)
# alert_value: a `value` annotation that is a number, else the last "(93 °C)" of the summary (numbers of at most
# 30 digits: a longer one would not fit a float8, where Python makes it infinite).
_PG_STATED = "btrim(a.annotations::json ->> 'value')"
_PG_NUMBER = "'^[-+]?([0-9]{1,30}[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]{1,2})?$'"
_PG_IN_SUMMARY = r"'.*\(\s*([-+]?[0-9]{1,30}(?:[.][0-9]+)?)\s*[^()0-9]{0,8}\s*\)'"
_PG_VALUE = (
    f"COALESCE(CASE WHEN {_PG_STATED} ~ {_PG_NUMBER} THEN {_PG_STATED}::float8 END, "
    f"(regexp_match(a.annotations::json ->> 'summary', {_PG_IN_SUMMARY}))[1]::float8)"
)
POSTGRESQL = Dialect(
    placeholder="%s",
    host=_PG_HOST,
    value=_PG_VALUE,
    label="(a.labels::json ->> %s)",
    contains="strpos(lower({text}), lower(%s)) > 0",
    label_path=False,
    text_order=' COLLATE "C"',
)


def register_functions(conn: Any) -> None:
    """The SQLite functions `SQLITE` names, on an sqlite3 connection."""
    conn.create_function("bot_alert_host", 1, _sqlite_host, deterministic=True)
    conn.create_function("bot_alert_value", 1, _sqlite_value, deterministic=True)


def _sqlite_host(labels: str | None) -> str:
    return host_from_labels(json.loads(labels or "{}"))


def _sqlite_value(annotations: str | None) -> float | None:
    return alert_value(json.loads(annotations or "{}"))[0]


# --- the list of incidents -------------------------------------------------------------------------------------
_HEADS = """SELECT i.id, i.alertname, i.state, i.opened_at, i.resolved_at, i.version,
       (SELECT COUNT(*) FROM incident_members m WHERE m.incident_id = i.id) AS alerts,
       (SELECT COUNT(*) FROM incident_members m JOIN alerts a ON a.key = m.alert_key
         WHERE m.incident_id = i.id AND a.status = 'firing') AS firing,
       (SELECT COUNT(*) FROM incident_members m JOIN alerts a ON a.key = m.alert_key
         WHERE m.incident_id = i.id AND a.acked_by IS NOT NULL) AS acked
  FROM incidents i {where}
 ORDER BY CASE WHEN i.state = 'open' THEN 0 ELSE 1 END, i.opened_at DESC, i.id LIMIT {p}"""


def heads_sql(dialect: Dialect, one: bool) -> str:
    """The open incidents first, then the most recent ones; `one`: the incident whose id is the first parameter."""
    where = f"WHERE i.id = {dialect.placeholder}" if one else ""
    return _HEADS.format(where=where, p=dialect.placeholder)


def head_from_row(row: Row) -> IncidentHead:
    opened = dt(row["opened_at"])
    assert opened is not None
    return IncidentHead(
        id=row["id"],
        alertname=row["alertname"],
        state=row["state"],
        opened_at=opened,
        resolved_at=dt(row["resolved_at"]),
        version=int(row["version"]),
        alerts=int(row["alerts"]),
        firing=int(row["firing"]),
        acked=int(row["acked"]),
    )


# --- one page of an incident's alerts --------------------------------------------------------------------------
_FROM = "FROM incident_members m JOIN alerts a ON a.key = m.alert_key WHERE m.incident_id = {p}"


def _sort_expression(query: AlertQuery, dialect: Dialect, params: list[Any]) -> str:
    """The expression the page is sorted by; a label's name goes in `params`."""
    label = query.label or {"gpu": "gpu", "alertname": "alertname"}.get(query.sort, "")
    if label:
        params.append(dialect.label_parameter(label))
        return dialect.label
    return {
        "host": dialect.host,
        "status": "a.status",
        "value": dialect.value,
        "started": "a.starts_at",
        "acked": "a.acked_by",
    }[query.sort]


def _filters(query: AlertQuery, dialect: Dialect) -> tuple[str, list[Any]]:
    p = dialect.placeholder
    conditions: list[str] = []
    params: list[Any] = []
    if query.host:
        conditions.append(dialect.contains.format(text=dialect.host))
        params.append(query.host)
    named = [("alertname", query.alertname)] * bool(query.alertname) + [("gpu", query.gpu)] * bool(query.gpu)
    for name, value in [*named, *query.labels]:
        conditions.append(f"{dialect.label} = {p}")
        params += [dialect.label_parameter(name), value]
    if query.status:
        conditions.append(f"a.status = {p}")
        params.append(query.status)
    if query.acked is not None:
        conditions.append("a.acked_by IS NOT NULL" if query.acked else "a.acked_by IS NULL")
    if query.silenced is not None:
        conditions.append("a.silence_id IS NOT NULL" if query.silenced else "a.silence_id IS NULL")
    return "".join(f" AND {c}" for c in conditions), params


def page_sql(incident_id: str, query: AlertQuery, dialect: Dialect) -> tuple[str, list[Any], str, list[Any]]:
    """(the page's SQL, its parameters, the count's SQL, its parameters). Alerts without the sorted value come
    last whichever the direction; equal ones in the order of their keys."""
    source = _FROM.format(p=dialect.placeholder)
    where, filter_params = _filters(query, dialect)
    sort_params: list[Any] = []
    sorted_by = _sort_expression(query, dialect, sort_params)
    direction = "DESC" if query.descending else "ASC"
    text = "" if query.sort in ("value", "started") and not query.label else dialect.text_order
    if query.sort == "gpu" and not query.label:  # GPU 10 after GPU 9: shorter first
        order = f"({sorted_by} IS NULL), length({sorted_by}) {direction}, {sorted_by}{text} {direction}"
        sort_params = sort_params * 3
    else:
        order = f"({sorted_by} IS NULL), {sorted_by}{text} {direction}"
        sort_params = sort_params * 2
    columns = ", ".join(f"a.{c.strip()}" for c in ALERT_WITHOUT_EVIDENCE.split(",") if "NULL AS" not in c)
    page = (
        f"SELECT {columns}, NULL AS enrichment {source}{where} ORDER BY {order}, a.key "
        f"LIMIT {dialect.placeholder} OFFSET {dialect.placeholder}"
    )
    offset = (query.page - 1) * query.per_page
    count = f"SELECT COUNT(*) AS matching {source}{where}"
    return (
        page,
        [incident_id, *filter_params, *sort_params, query.per_page, offset],
        count,
        [incident_id, *filter_params],
    )

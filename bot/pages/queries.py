"""The table's questions and answers: a request's query string as the store's `AlertQuery` (a wrong one is a 400
with words), and a page of alerts as the JSON rows the page's script shows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multidict import MultiMapping

from bot.incident.members import alert_value
from bot.models import AlertState, host_from_labels, short_id
from bot.render.incident_text import number
from bot.storage.pages import SORT_KEYS, AlertPage, AlertQuery, IncidentHead

_YES_NO = {"yes": True, "no": False, "": None}
# What a row shows of an alert's labels: all of them but those it has columns for.
_SHOWN_ELSEWHERE = frozenset({"alertname", "gpu"})


class BadQuery(ValueError):
    """The query string asks for something the table cannot do: said in words."""


def alert_query(params: MultiMapping[str]) -> AlertQuery:
    sort = params.get("sort", "value").strip()
    label = ""
    if sort.startswith("label:"):
        sort, label = "value", sort.removeprefix("label:")
    elif sort not in SORT_KEYS:
        raise BadQuery(f"cannot sort by {sort!r}: one of {', '.join(SORT_KEYS)}, or label:NAME")
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadQuery(f"order is asc or desc, not {order!r}")
    status = params.get("status", "")
    if status not in ("", "firing", "resolved"):
        raise BadQuery(f"status is firing or resolved, not {status!r}")
    try:
        return AlertQuery(
            sort=sort,  # type: ignore[arg-type]  # checked against SORT_KEYS above
            label=label,
            descending=order == "desc",
            page=_whole(params, "page", 1),
            per_page=_whole(params, "per_page", 100),
            host=params.get("host", "").strip(),
            alertname=params.get("alertname", "").strip(),
            gpu=params.get("gpu", "").strip(),
            status=status,  # type: ignore[arg-type]  # checked above
            acked=_yes_no(params, "acked"),
            labels=tuple(_label_pair(text) for text in params.getall("label", []) if text.strip()),
        )
    except ValueError as exc:
        raise BadQuery(str(exc)) from None


def _whole(params: MultiMapping[str], name: str, default: int) -> int:
    text = params.get(name, str(default)).strip()
    if not text.isdecimal() or len(text) > 9:
        raise BadQuery(f"{name} is a whole number, not {text!r}")
    return int(text)


def _yes_no(params: MultiMapping[str], name: str) -> bool | None:
    text = params.get(name, "").strip().lower()
    if text not in _YES_NO:
        raise BadQuery(f"{name} is yes or no, not {text!r}")
    return _YES_NO[text]


def _label_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep:
        raise BadQuery(f"a label filter is NAME=VALUE, for example row=C, not {text!r}")
    return name.strip(), value.strip().strip('"')


def row(alert: AlertState) -> dict[str, Any]:
    value, unit = alert_value(alert.annotations)
    return {
        "id": short_id(alert.key),
        "alertname": alert.alertname,
        "host": host_from_labels(alert.labels),
        "gpu": alert.labels.get("gpu", ""),
        "status": alert.status,
        "value": value,
        "value_text": "" if value is None else f"{number(value)}{' ' + unit if unit else ''}",
        "started": alert.starts_at.strftime("%Y-%m-%d %H:%M:%S"),
        "acked_by": alert.acked_by,
        "silenced_by": alert.silenced_by,
        "labels": {name: text for name, text in sorted(alert.labels.items()) if name not in _SHOWN_ELSEWHERE},
    }


def page_json(page: AlertPage, total: int) -> dict[str, Any]:
    return {
        "rows": [row(alert) for alert in page.alerts],
        "matching": page.matching,
        "total": total,
        "page": page.query.page,
        "per_page": page.query.per_page,
    }


def head_json(head: IncidentHead) -> Mapping[str, Any]:
    """What an open page polls: the stamp changes with anything the page shows (a version, an alert resolved or
    acknowledged)."""
    return {
        "version": head.version,
        "state": head.state,
        "alerts": head.alerts,
        "firing": head.firing,
        "acked": head.acked,
        "stamp": stamp(head),
    }


def stamp(head: IncidentHead) -> str:
    return f"{head.version}.{head.alerts}.{head.firing}.{head.acked}"

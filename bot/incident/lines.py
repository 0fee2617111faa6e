"""An incident's alerts' lines where they are needed: a delivery carries none (a version of a 100,000-alert incident
would carry them all), so a receiver that attaches or counts them reads them from the store as it sends."""

from __future__ import annotations

from bot.incident.model import AlertLine, IncidentView
from bot.storage.interface import Store


async def with_alerts(view: IncidentView, store: Store) -> IncidentView:
    """The view with its alerts' lines, as they stand now; a view made in the process keeps its own."""
    if view.alerts is not None:
        return view
    return view.model_copy(update={"alerts": await store.incident_alerts(view.id)})


async def alert_lines(view: IncidentView, store: Store) -> list[AlertLine]:
    """The incident's alerts' lines: the view's own, else the store's."""
    return (await with_alerts(view, store)).alerts or []

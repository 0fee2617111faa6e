"""Finding the alert a command or a button is about."""

from __future__ import annotations

from collections.abc import Sequence

from bot.interact.dispatch import UsageError
from bot.models import AlertState
from bot.render.slack import escape
from bot.storage.interface import Store

ALREADY_RESOLVED = "This alert is already resolved; nothing was changed."


async def alert_by_short_id(store: Store, args: Sequence[str]) -> AlertState:
    """The alert a command names by its short id (the only argument); UsageError otherwise."""
    if len(args) != 1:
        raise UsageError("Give one alert id, as shown on the alert's message or by `list`.")
    alert = await store.alert_by_short_id(args[0])
    if alert is None:
        raise UsageError(f"Unknown alert id `{escape(args[0][:20])}`.")
    return alert


async def firing_alert(store: Store, key: str) -> AlertState | None:
    """The alert a button is about; None when it is gone (pruned) or resolved: either way, nothing to do."""
    alert = await store.get_alert(key)
    return alert if alert is not None and alert.status == "firing" else None

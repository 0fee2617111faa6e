"""When an email receiver mails an incident: the first version at once, then at most one digest of what changed per
`digest_interval`, and the recovery at once.

An incident that fires again after its recovery is mailed at once too. An incident's delivery that comes before
the interval is over is held (`DeliveryResult.hold`): the outbox offers
it again when the interval ends, or the newest version that superseded it meanwhile, so however many versions
come in the interval the digest is one mail. A version that changed nothing a reader would notice is no mail.
When the receiver last mailed the incident, which version and what it said are kept in the receiver's sink state
(key `incident:<id>`), so a restart neither mails the incident again nor forgets the interval.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from email.message import EmailMessage
from typing import Any

from bot.clock import Clock
from bot.config import EmailReceiver
from bot.incident.lines import with_alerts
from bot.incident.model import IncidentView, incident_key
from bot.render.email import build_email
from bot.render.email_incident import IncidentMail, changes, incident_snapshot, render_incident_email
from bot.sinks.base import DeliveryResult
from bot.storage.interface import Store

# Sends one mail for a delivery (its id keeps the recipients already served across retries).
SendMail = Callable[[int, EmailMessage], Awaitable[DeliveryResult]]


class IncidentMails:
    def __init__(self, config: EmailReceiver, store: Store, clock: Clock, domain: str) -> None:
        self._config = config
        self._store = store
        self._clock = clock
        self._domain = domain

    async def deliver(self, delivery_id: int, view: IncidentView, send: SendMail) -> DeliveryResult:
        key = incident_key(view.id)
        state = await self._store.get_sink_state(self._config.name, key)
        if state is not None and view.version <= int(state.get("version", 0)):
            return DeliveryResult.ok()  # told already (a retried or superseded version)
        recovered = state is not None and bool(state.get("resolved"))
        now = self._clock.now()
        if state is not None and not recovered and view.status != "resolved":
            wait = self._config.digest_interval - (now - datetime.fromisoformat(state["mailed_at"])).total_seconds()
            if wait > 0:
                return DeliveryResult.hold(wait, "digest_interval")
        mail = incident_mail(await with_alerts(view, self._store), self._domain, state)
        if mail is None:  # nothing to tell: remember the version, keep the interval running from the last mail
            await self._store.put_sink_state(self._config.name, key, {**(state or {}), "version": view.version})
            return DeliveryResult.ok()
        message = build_email(mail.rendered, self._config.sender, self._config.to, now, attachments=mail.attachments)
        result = await send(delivery_id, message)
        if result.delivered:
            await self._store.put_sink_state(
                self._config.name,
                key,
                {
                    "mailed_at": now.isoformat(),
                    "version": view.version,
                    "title": (state or {}).get("title") or view.title,
                    "snapshot": incident_snapshot(view),
                    "resolved": view.status == "resolved",
                    "mails": int((state or {}).get("mails", 0)) + 1,
                },
            )
        return result


def incident_mail(view: IncidentView, domain: str, state: dict[str, Any] | None) -> IncidentMail | None:
    """The mail this view makes after the one `state` remembers (None: none yet), ignoring the interval (so also
    the preview); None when it says nothing new."""
    if state is None:
        return render_incident_email(view, domain, "resolved" if view.status == "resolved" else "opening")
    title = str(state.get("title", ""))
    recovered = bool(state.get("resolved"))
    if view.status == "resolved":
        return None if recovered else render_incident_email(view, domain, "resolved", opening_title=title)
    changed = changes(view, state.get("snapshot", {}))
    if recovered:  # open again: news, whatever the interval
        changed.insert(0, f"Firing again after its recovery: {view.scope.firing:,} alerts firing")
    if not changed:
        return None
    since = datetime.fromisoformat(state["mailed_at"])
    return render_incident_email(view, domain, "digest", opening_title=title, changed=changed, since=since)

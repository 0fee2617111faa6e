"""An incident on one PagerDuty receiver: one trigger (the incident's dedup_key), a new trigger with the same key
when it changed materially (bot/render/pagerduty_incident.py), one resolve (and a new trigger, which PagerDuty
takes as a new alert, if it fires again after that); and the member alerts that were paged
on their own before the incident was recognised are resolved into it.

Why resolve the earlier pages: one cause should be one open alert on the responder's phone, and each early page
would otherwise escalate on its own while the incident tells the whole. They are resolved only after PagerDuty
accepted the incident's trigger, which names them, so there is never a moment with nothing open; it costs one
event each, and only the few alerts paged before recognition have one. Their own resolve, later, finds them
resolved (PagerDuty drops it).

Which alerts have an open page is kept in the receiver's sink state (key `pages`), written after each accepted
trigger and resolve of an alert. The incident's own state (key `incident:<id>`: the last version seen, the material
digest PagerDuty has, whether it was triggered or resolved) makes a retry resume where it stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import PagerDutyReceiver
from bot.incident.lines import alert_lines
from bot.incident.model import IncidentView, incident_key
from bot.render.pagerduty_incident import findings, incident_dedup_key, incident_trigger, material, resolve_event
from bot.sinks.base import DeliveryResult
from bot.storage.interface import Store

Post = Callable[[dict[str, Any]], Awaitable[DeliveryResult]]
PAGES_KEY = "pages"
# An update that only names hosts that joined waits this long after the last one: within seconds on the responder's
# phone, at most 6 events a minute for an incident however fast it grows.
HOSTS_PACE = 10.0


class OpenPages:
    """The alerts of one receiver with a page open in PagerDuty (alert key -> dedup_key). One process owns a
    receiver at a time; the lock keeps its read-modify-writes whole when incident and alert deliveries overlap."""

    def __init__(self, store: Store, receiver: str) -> None:
        self._store = store
        self._receiver = receiver
        self._lock = asyncio.Lock()

    async def opened(self, alert_key: str, dedup_key: str) -> None:
        async with self._lock:
            pages = await self._read()
            if pages.get(alert_key) != dedup_key:
                await self._write({**pages, alert_key: dedup_key})

    async def closed(self, alert_keys: Iterable[str]) -> None:
        gone = set(alert_keys)
        async with self._lock:
            pages = await self._read()
            left = {key: value for key, value in pages.items() if key not in gone}
            if left != pages:
                await self._write(left)

    async def among(self, alert_keys: Iterable[str]) -> dict[str, str]:
        pages = await self._read()
        return {key: pages[key] for key in alert_keys if key in pages}

    async def _read(self) -> dict[str, str]:
        state = await self._store.get_sink_state(self._receiver, PAGES_KEY) or {}
        return dict(state.get("open", {}))

    async def _write(self, pages: dict[str, str]) -> None:
        await self._store.put_sink_state(self._receiver, PAGES_KEY, {"open": pages})


class IncidentPages:
    def __init__(self, config: PagerDutyReceiver, store: Store, pages: OpenPages, clock: Clock = SYSTEM_CLOCK) -> None:
        self._config = config
        self._store = store
        self._pages = pages
        self._clock = clock

    async def deliver(self, view: IncidentView, routing_key: str, post: Post) -> DeliveryResult:
        key = incident_key(view.id)
        state = await self._store.get_sink_state(self._config.name, key) or {}
        if view.version <= int(state.get("version", 0)):
            return DeliveryResult.ok()  # told already (a retried or superseded version)
        earlier = await self._pages.among(alert.alert_key for alert in await alert_lines(view, self._store))
        if view.status == "resolved":
            if state.get("triggered") and not state.get("resolved"):
                result = await post(resolve_event(routing_key, incident_dedup_key(view.id)))
                if not result.delivered:
                    return result
            result = await self._resolve_earlier(earlier, routing_key, post)
            if result.delivered:
                await self._save(key, state, version=view.version, resolved=True)
            return result
        digest = material(view)
        # Firing again after its resolve: the same dedup_key opens a new PagerDuty alert.
        if not state.get("triggered") or state.get("resolved") or state.get("material") != digest:
            wait = self._paced(state, view)
            if wait > 0:
                return DeliveryResult.hold(wait, "pagerduty_pace")
            absorbed = sorted({*state.get("absorbed", []), *earlier.values()})
            result = await post(incident_trigger(view, self._config, routing_key, absorbed))
            if not result.delivered:
                return result
            now = self._clock.now().timestamp()
            state = await self._save(
                key,
                state,
                material=digest,
                findings=findings(view),
                triggered=True,
                triggered_at=now,
                resolved=False,
                absorbed=absorbed,
            )
        result = await self._resolve_earlier(earlier, routing_key, post)
        if result.delivered:
            await self._save(key, state, version=view.version)
        return result

    def _paced(self, state: dict[str, Any], view: IncidentView) -> float:
        """Seconds to wait before an update that only names more hosts (an incident growing host by host updates
        its alert at most every `HOSTS_PACE` seconds); 0 for anything else."""
        if not state.get("triggered") or state.get("resolved") or state.get("findings") != findings(view):
            return 0.0
        return float(state.get("triggered_at", 0.0)) + HOSTS_PACE - self._clock.now().timestamp()

    async def _resolve_earlier(self, earlier: dict[str, str], routing_key: str, post: Post) -> DeliveryResult:
        """Resolve the members' own pages, each forgotten as soon as PagerDuty took its resolve."""
        for alert_key, dedup_key in earlier.items():
            result = await post(resolve_event(routing_key, dedup_key))
            if not result.delivered:
                return result
            await self._pages.closed([alert_key])
        return DeliveryResult.ok()

    async def _save(self, key: str, state: dict[str, Any], **changes: Any) -> dict[str, Any]:
        saved = {**state, **changes}
        await self._store.put_sink_state(self._config.name, key, saved)
        return saved

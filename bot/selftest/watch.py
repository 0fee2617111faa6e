"""How the self-test sees what the bot did with its synthetic alert: in the bot's own store (read-only, beside the
running bot), or, for a bot on another host (`--bot URL`), in its /metrics."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bot.clock import Clock
from bot.deadman import is_armed
from bot.failure import what_failed
from bot.models import AlertStatus, EventKind
from bot.selftest.diagnose import Samples
from bot.selftest.path import SyntheticAlert
from bot.selftest.steps import StepFailed, duration
from bot.selftest_label import ALERTNAME, LABEL
from bot.storage.interface import DeliveryRecord, Store, StoreUnavailable

T = TypeVar("T")
_POLL = 0.25
PROGRESS_EVERY = 5.0
_ALERTS = "gpu_alert_bot_alerts_received_total"
_DELIVERIES = "gpu_alert_bot_deliveries_total"
_ARMED = "gpu_alert_bot_deadman_armed"


class BotWatch(Protocol):
    async def mark(self) -> None:
        """Remember where things stand, just before an alert or its resolve is sent."""

    async def received(self, alert: SyntheticAlert, status: AlertStatus) -> str | None:
        """How the bot shows it has the alert in this status; None while it has not."""

    async def delivery(self, kind: EventKind, receiver: str) -> DeliveryRecord | None:
        """The delivery once settled (delivered or failed); None while it is pending or not queued yet."""

    async def armed(self) -> bool:
        """Whether the bot's dead man's switch is armed: a Watchdog reached it."""


class StoreWatch:
    """Exactly this alert's episode and its deliveries, from the bot's store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._key = ""

    async def mark(self) -> None:
        return None

    async def received(self, alert: SyntheticAlert, status: AlertStatus) -> str | None:
        for state in await self._store.recent_alerts([ALERTNAME], alert.started):
            if state.labels.get(LABEL) == alert.run_id and state.status == status:
                self._key = state.key
                return f"alert {state.key} {status} in the bot's store"
        return None

    async def delivery(self, kind: EventKind, receiver: str) -> DeliveryRecord | None:
        for record in await self._store.alert_deliveries(self._key):
            if record.event_kind == kind and record.receiver == receiver and record.state != "pending":
                return record
        return None

    async def armed(self) -> bool:
        return is_armed(await self._store.watchdog_records())


class MetricsWatch:
    """The bot's counters moving since the mark: alerts received (the ingest process's /metrics), deliveries per
    receiver (the worker process's). Another alert arriving at the same moment can be taken for the self-test's;
    on day one there is none."""

    def __init__(self, bot_url: str, worker_url: str, http: httpx.AsyncClient) -> None:
        self.url = f"{bot_url.rstrip('/')}/metrics"
        self.worker_url = f"{worker_url.rstrip('/')}/metrics"
        self._http = http
        self._marked: dict[str, Samples] = {}

    async def mark(self) -> None:
        self._marked = {url: await self.samples(url) for url in (self.url, self.worker_url)}

    async def received(self, alert: SyntheticAlert, status: AlertStatus) -> str | None:
        if await self._moved(self.url, _ALERTS, status=status):
            return f'{_ALERTS}{{status="{status}"}} went up on {self.url}'
        return None

    async def delivery(self, kind: EventKind, receiver: str) -> DeliveryRecord | None:
        for result in ("delivered", "failed"):
            if await self._moved(self.worker_url, _DELIVERIES, receiver=receiver, result=result):
                error = None if result == "delivered" else "given up; the bot's log says why"
                return DeliveryRecord(kind, receiver, result, 1, error)
        return None

    async def armed(self) -> bool:
        """As the ingest process, which runs the switch, last checked it (every deadman.check_interval)."""
        return (await self.samples(self.url)).get((_ARMED, ()), 0.0) == 1.0

    async def _moved(self, url: str, name: str, **labels: str) -> bool:
        key = (name, tuple(sorted(labels.items())))
        return (await self.samples(url)).get(key, 0.0) > self._marked.get(url, {}).get(key, 0.0)

    async def samples(self, url: str) -> Samples:
        try:
            response = await self._http.get(url)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            whose = "the bot's worker process is down or its /metrics is elsewhere (worker.metrics_listen)"
            raise StepFailed(
                f"cannot read {url}: {what_failed(exc)}",
                "the bot is down or not at this URL (--bot)" if url == self.url else whose,
                f"curl -s {url} | grep gpu_alert_bot_",
            ) from None
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
        }


class Wait:
    """The alert path's waits, all within the run's `--timeout` (one deadline on the clock), each saying every
    PROGRESS_EVERY seconds what it waits for and how long it has waited."""

    def __init__(self, clock: Clock, timeout: float, say: Callable[[str], None]) -> None:
        self._clock = clock
        self._timeout = timeout
        self._deadline = clock.monotonic() + timeout
        self._say = say

    async def until(
        self,
        what: Callable[[], Awaitable[T | None]],
        waiting_for: str,
        cause: str,
        look: str,
        known_cause: Callable[[], Awaitable[StepFailed | None]] | None = None,
    ) -> T:
        """Poll `what` until it gives something, or fail when the self-test's time is up, or as soon as
        `known_cause` tells why it will not come."""
        said = self._clock.monotonic()
        while True:
            try:
                found = await what()
            except StoreUnavailable as exc:
                raise StepFailed(
                    f"cannot read the bot's store: {exc}", "the store path is not the bot's", look
                ) from None
            if found is not None:
                return found
            failure = await known_cause() if known_cause is not None else None
            if failure is not None:
                raise failure
            now = self._clock.monotonic()
            if now >= self._deadline:
                raise StepFailed(
                    f"timed out waiting for {waiting_for} (--timeout {duration(self._timeout)})", cause, look
                )
            if now - said >= PROGRESS_EVERY:
                said = now
                spent = self._timeout - (self._deadline - now)
                self._say(f"waiting for {waiting_for}: {spent:.0f} s of {self._timeout:.0f} s")
            await self._clock.sleep(_POLL)

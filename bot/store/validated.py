"""Parse once: the payloads ingest validated, handed to dedup when one process does both."""

from __future__ import annotations

from collections.abc import Sequence

from bot.models import WebhookPayload
from bot.storage.interface import IncomingNotification, IngestResult
from bot.store import core

# A few seconds of a storm, a few MB at most.
VALIDATED_PAYLOADS_KEPT = 256


class ValidatedPayloads:
    """Payloads ingest validated in this process, by notification id, until dedup applies them: a body is parsed
    once when one process both acknowledges and processes it. Bounded: past `limit` the oldest are forgotten and
    dedup parses their bodies, as it does for any notification another process (or an earlier one) stored.
    Nothing is kept until this store applies notifications too (`applying`): a process that only acknowledges
    (`serve --role ingest`, or the ingest side of `--role all`) would hold payloads nobody takes.
    A backend calls `keep` once the batch is committed, never before: a rolled-back id may be taken again."""

    def __init__(self, limit: int = VALIDATED_PAYLOADS_KEPT) -> None:
        self._limit = limit
        self._payloads: dict[int, WebhookPayload] = {}
        self._applying = False

    def applying(self) -> None:
        """Dedup runs on this store: from now on, keep what ingest validated."""
        self._applying = True

    def keep(self, batch: Sequence[IncomingNotification], results: Sequence[IngestResult]) -> None:
        if not self._applying:
            return
        for notification, result in zip(batch, results, strict=True):
            if notification.payload is not None and result.notification_id is not None and not result.duplicate:
                self._payloads[result.notification_id] = notification.payload
        while len(self._payloads) > self._limit:
            del self._payloads[next(iter(self._payloads))]

    def read(self, notification_id: int, body: bytes) -> core.ParsedNotification:
        """`read_notification(body)`, without the parse when ingest in this process validated it."""
        payload = self._payloads.pop(notification_id, None)
        return core.read_notification(body) if payload is None else (payload, core.episodes(payload))

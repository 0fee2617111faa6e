"""An alert the bot already stored, as the webhook body that brought it, and the incident it is a line of: what
`explain --alert ID` explains."""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import StoreConfig
from bot.incident.record import IncidentRecord
from bot.models import AlertState, AmAlert, WebhookPayload
from bot.store import StoreUnavailable, open_store


class StoredAlertError(Exception):
    """The store cannot be read, or holds no alert by that id."""


@dataclass(frozen=True)
class StoredAlert:
    payload: WebhookPayload
    # The incident it is a line of (None: told on its own), and whether it was told on its own too (before the
    # incident opened, it had deliveries of its own).
    incident: IncidentRecord | None = None
    told_alone: bool = True


async def stored_alert(config: StoreConfig, alert_id: str) -> StoredAlert:
    """The stored alert episode named by its short id (as in its messages) or its key, as a one-alert webhook body
    of the group and receiver it came with, and its incident; the store is opened read-only."""
    where = "the PostgreSQL store" if config.backend == "postgresql" else f"the store {config.path}"
    try:
        store = await open_store(config, read_only=True)
    except StoreUnavailable as exc:
        raise StoredAlertError(f"cannot open {where}: {exc} (--config names the bot's configuration)") from None
    try:
        alert = await store.alert_by_short_id(alert_id) or await store.get_alert(alert_id.strip())
        if alert is None:
            raise StoredAlertError(f"no alert {alert_id!r} in {where}: give the short id its message shows, or its key")
        incident_id = await store.alert_incident(alert.key)
        incident = None if incident_id is None else await store.get_incident(incident_id)
        told_alone = incident is None or bool(await store.alert_deliveries(alert.key))
    finally:
        await store.close()
    return StoredAlert(_payload(alert), incident, told_alone)


def _payload(alert: AlertState) -> WebhookPayload:
    ends_at = (alert.ends_at or alert.resolved_at) if alert.status == "resolved" else None
    am_alert = AmAlert(
        status=alert.status,
        labels=alert.labels,
        annotations=alert.annotations,
        starts_at=alert.starts_at,
        ends_at=ends_at,
        generator_url=alert.generator_url,
        fingerprint=alert.fingerprint,
    )
    return WebhookPayload(
        version="4",
        group_key=alert.group_key,
        status=alert.status,
        receiver=alert.receiver,
        external_url=alert.external_url,
        alerts=[am_alert],
    )

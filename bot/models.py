"""Data shapes shared by every stage: Alertmanager's webhook payload and the bot's own alert and event records."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, Strict, field_validator

from bot.message import Message

SUPPORTED_PAYLOAD_VERSION = "4"

AlertStatus = Literal["firing", "resolved"]
Timestamp = Annotated[AwareDatetime, Strict()]

_GO_ZERO_YEAR = 1
_PLAUSIBLE_YEARS = (1970, 9000)
_QUOTE_META_ESCAPE = re.compile(r"\\(.)")


class AmAlert(BaseModel):
    """One alert as Alertmanager (0.25 to 0.28+) sends it in a webhook."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: Timestamp = Field(alias="startsAt")
    ends_at: Timestamp | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    fingerprint: str = Field(min_length=1, max_length=64)

    @field_validator("starts_at")
    @classmethod
    def _starts_in_utc(cls, value: datetime) -> datetime:
        # Alertmanager always sets a start; Go's zero time (or a far-off year) would break every time window.
        if not _PLAUSIBLE_YEARS[0] <= value.year <= _PLAUSIBLE_YEARS[1]:
            raise ValueError(f"must be a real start time, not {value.isoformat()}")
        return _in_utc(value)

    @field_validator("ends_at")
    @classmethod
    def _go_zero_time_means_no_end(cls, value: datetime | None) -> datetime | None:
        # Alertmanager blanks the end of a firing alert to Go's zero time, 0001-01-01T00:00:00Z.
        if value is None or value.year == _GO_ZERO_YEAR:
            return None
        return _in_utc(value)

    @property
    def key(self) -> str:
        return alert_key(self.fingerprint, self.starts_at)


def _in_utc(value: datetime) -> datetime:
    """The same instant in UTC, so keys and comparisons never depend on the sender's offset."""
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise ValueError("timestamp out of range") from None


class WebhookPayload(BaseModel):
    """Alertmanager's webhook body, payload version 4; unknown extra fields are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    version: str
    group_key: str = Field(alias="groupKey")
    truncated_alerts: int = Field(default=0, ge=0, alias="truncatedAlerts")
    status: AlertStatus
    receiver: str
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[AmAlert]

    @property
    def receiver_name(self) -> str:
        """The receiver's real name: Alertmanager sends it through regexp.QuoteMeta (web.hook -> web\\.hook)."""
        return _QUOTE_META_ESCAPE.sub(r"\1", self.receiver)

    def idempotency_key(self) -> str:
        """Same key for a retry, a repeat or an HA replica's copy; externalURL is left out on purpose."""
        # starts_at is already in UTC (see AmAlert), so one instant always gives one text.
        members = sorted(f"{a.fingerprint}\x00{a.status}\x00{a.starts_at.isoformat()}" for a in self.alerts)
        return hashlib.sha256("\x00".join([self.group_key, *members]).encode()).hexdigest()


# `host` first: the label config/prometheus.yml puts on every series of a GPU server. dcgm-exporter's own
# `Hostname` is the container's ID unless its container is given a hostname (or NODE_NAME).
DEFAULT_HOST_LABELS = ("host", "Hostname", "hostname", "node", "instance")


def host_from_labels(labels: Mapping[str, str], candidates: tuple[str, ...] | list[str] = DEFAULT_HOST_LABELS) -> str:
    """The host an alert is about: the first candidate label present, without the port of an `instance`."""
    for name in candidates:
        value = labels.get(name, "").strip()
        if value:
            return _strip_port(value) if name == "instance" else value
    return ""


def _strip_port(instance: str) -> str:
    if instance.startswith("["):  # [::1]:9400
        return instance[1:].split("]", 1)[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else instance


def alert_key(fingerprint: str, starts_at: datetime) -> str:
    """Identity of one firing episode: the label-set fingerprint plus when it started."""
    return f"{fingerprint}@{starts_at.astimezone(UTC).isoformat()}"


# Lowercase letters and digits, without the look-alikes 0/o and 1/l/i: typed from a phone without a doubt.
SHORT_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"
SHORT_ID_LENGTH = 7


def short_id(alert_key: str) -> str:
    """A short, stable name for one alert episode that people can type (`/gpu ack k3x9m2p`)."""
    number = int.from_bytes(hashlib.sha256(alert_key.encode()).digest()[:8], "big")
    letters = []
    for _ in range(SHORT_ID_LENGTH):
        number, index = divmod(number, len(SHORT_ID_ALPHABET))
        letters.append(SHORT_ID_ALPHABET[index])
    return "".join(letters)


class EventKind(StrEnum):
    FIRING = "firing"
    REPEAT = "repeat"
    RESOLVED = "resolved"
    # The same episode firing again after its resolve (Alertmanager re-sends an alert with the same start
    # when Prometheus could not reach it for longer than the alert's endsAt margin).
    REFIRING = "refiring"
    ACK = "ack"
    # Something a person or the bot says about the alert (an outcome, a comment): told in the alert's conversation.
    NOTE = "note"
    # An incident changed (bot/incident/): its deliveries hang on an event of its own, routed as it is written.
    INCIDENT = "incident"


class AlertState(BaseModel):
    """What the store knows of one alert episode."""

    model_config = ConfigDict(frozen=True)

    key: str
    fingerprint: str
    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: datetime
    ends_at: datetime | None = None
    generator_url: str = ""
    group_key: str = ""
    receiver: str = ""
    external_url: str = ""
    first_seen: datetime
    last_seen: datetime
    times_seen: int = 1
    resolved_at: datetime | None = None
    acked_by: str | None = None
    acked_at: datetime | None = None
    enrichment: dict[str, Any] | None = None
    # The Alertmanager silence set from the bot for this episode, while the bot knows it active.
    silence_id: str | None = None
    silenced_by: str | None = None
    silenced_until: datetime | None = None

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")


class Event(BaseModel):
    """Something that happened to an alert and is worth telling people: it goes through the pipeline once."""

    model_config = ConfigDict(frozen=True)

    id: int
    kind: EventKind
    created_at: datetime
    alert: AlertState
    attempts: int = 1
    # The text of a NOTE event.
    note: str = ""


class NewDelivery(BaseModel):
    """A message to hand to one receiver, written to the outbox together with the event's routing."""

    model_config = ConfigDict(frozen=True)

    receiver: str
    message: Message


class Delivery(BaseModel):
    """One outbox row: a message on its way to one receiver."""

    model_config = ConfigDict(frozen=True)

    id: int
    event_id: int
    alert_key: str
    receiver: str
    message: Message
    attempts: int
    created_at: datetime


class GpuEvent(BaseModel):
    """One thing that happened to one physical GPU (an Xid, an alert), kept for recurrence counts."""

    model_config = ConfigDict(frozen=True)

    gpu_key: str
    host: str = ""
    pci_bus_id: str = ""
    uuid: str = ""
    kind: Literal["xid", "alert"]
    code: str
    at: datetime
    alert_key: str = ""


@dataclass(frozen=True)
class EventRoute:
    """What one event's routing writes: the enrichment gathered now (None when kept from before), its deliveries."""

    event_id: int
    enrichment: dict[str, Any] | None
    deliveries: Sequence[NewDelivery]


@dataclass(frozen=True)
class IncidentRoute:
    """An incident's new version for its receivers (each delivery's message carries the incident's view)."""

    incident_key: str
    deliveries: Sequence[NewDelivery]


@dataclass(frozen=True)
class GpuHistoryRequest:
    """One alert's GPU history: the events it records, and the keys and time since which it reads."""

    events: Sequence[GpuEvent]
    since: datetime
    gpu_keys: Sequence[str]

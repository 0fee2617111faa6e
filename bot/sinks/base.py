"""The Sink interface: every integration (console, Slack, email, PagerDuty) delivers one outbox row at a time.

Like Alertmanager's notifiers, a sink never retries by itself: it tells the outbox whether the attempt
delivered, should be retried later (with an optional delay hint, e.g. from Retry-After), or failed for good
(a 4xx a retry cannot fix). The outbox owns retries, backoff and persistence.

A sink also previews a delivery: what it would send, rendered by the code its `deliver` uses, with no network,
no store and no secret (`gpu-alert-bot explain` shows it). A sink type's preview-only construction (see
`bot.sinks.SinkType`) needs only the receiver's configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from bot.models import Delivery


@dataclass(frozen=True)
class DeliveryResult:
    """`reason` is a short, stable code (`http_503`, `channel_not_found`, `timeout`) fit for a metric label;
    `detail` is the human-readable text for logs."""

    delivered: bool
    retry: bool = False
    delay: float | None = None
    reason: str = ""
    detail: str = ""
    # Not a failure: the sink chose to send this later (an email digest's interval). Counts as no attempt.
    held: bool = False

    @classmethod
    def ok(cls) -> DeliveryResult:
        return cls(delivered=True)

    @classmethod
    def retry_later(cls, reason: str, detail: str = "", delay: float | None = None) -> DeliveryResult:
        return cls(delivered=False, retry=True, delay=delay, reason=reason, detail=detail)

    @classmethod
    def hold(cls, delay: float, reason: str = "held") -> DeliveryResult:
        """Send this delivery again in `delay` seconds (or a newer version of it, for an incident's message)."""
        return cls(delivered=False, retry=True, delay=delay, reason=reason, held=True)

    @classmethod
    def failed(cls, reason: str, detail: str = "") -> DeliveryResult:
        return cls(delivered=False, retry=False, reason=reason, detail=detail)


# JSON-ready: the fields shown for one receiver in `explain --format json` (e.g. Slack's channel and payload).
Preview = dict[str, Any]


class Previewer(Protocol):
    """What one configured receiver would send. `name` is the receiver's name from the configuration."""

    name: str

    def preview(self, delivery: Delivery) -> Preview: ...


class Sink(Previewer, Protocol):
    """One configured receiver, delivering for real."""

    async def deliver(self, delivery: Delivery) -> DeliveryResult: ...

    async def close(self) -> None: ...

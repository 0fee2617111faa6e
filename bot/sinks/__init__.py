"""Sinks: one per configured receiver. `build_sinks` turns the receivers section into live sinks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from bot.config import ConsoleReceiver, EmailReceiver, PagerDutyReceiver, Receiver, SlackReceiver
from bot.metrics import Metrics
from bot.sinks.base import DeliveryResult, Sink
from bot.sinks.console import ConsoleSink
from bot.sinks.email import EmailSink
from bot.sinks.pagerduty import PagerDutySink
from bot.sinks.slack import SlackRateLimits, SlackSink
from bot.store.base import Store

__all__ = ["DeliveryResult", "Sink", "build_sinks"]


def build_sinks(
    receivers: Sequence[Receiver], store: Store, metrics: Metrics, console: TextIO | None = None
) -> dict[str, Sink]:
    sinks: dict[str, Sink] = {}
    slack_limits = SlackRateLimits()  # one pace per Slack channel, whichever receivers post there
    for receiver in receivers:
        if isinstance(receiver, ConsoleReceiver):
            sinks[receiver.name] = ConsoleSink(receiver.name, console)
        elif isinstance(receiver, EmailReceiver):
            sinks[receiver.name] = EmailSink(receiver, store)
        elif isinstance(receiver, PagerDutyReceiver):
            sinks[receiver.name] = PagerDutySink(receiver)
        elif isinstance(receiver, SlackReceiver):
            sinks[receiver.name] = SlackSink(receiver, store, metrics, slack_limits)
        else:
            raise NotImplementedError(f"receiver type {receiver.type!r} is not available yet")
    return sinks

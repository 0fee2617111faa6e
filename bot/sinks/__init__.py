"""Sinks: one per configured receiver. `build_sinks` turns the receivers section into live sinks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TextIO, assert_never

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import ConsoleReceiver, EmailReceiver, PagerDutyReceiver, Receiver, SlackReceiver
from bot.metrics import Metrics
from bot.render.slack import Controls
from bot.sinks.base import DeliveryResult, Sink
from bot.sinks.console import ConsoleSink
from bot.sinks.email import EmailSink
from bot.sinks.pagerduty import PagerDutySink
from bot.sinks.slack import SlackRateLimits, SlackSink
from bot.store.base import Store

__all__ = ["DeliveryResult", "Sink", "build_sinks"]


def build_sinks(
    receivers: Sequence[Receiver],
    store: Store,
    metrics: Metrics,
    console: TextIO | None = None,
    slack_controls: Mapping[str, Controls] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> dict[str, Sink]:
    """`slack_controls`: the buttons each Slack receiver's messages may show (none for a receiver not listed)."""
    sinks: dict[str, Sink] = {}
    slack_limits = SlackRateLimits(clock)  # one pace per Slack channel, whichever receivers post there
    for receiver in receivers:
        controls = (slack_controls or {}).get(receiver.name, Controls())
        sinks[receiver.name] = _sink(receiver, store, metrics, console, slack_limits, controls, clock)
    return sinks


def _sink(
    receiver: Receiver,
    store: Store,
    metrics: Metrics,
    console: TextIO | None,
    slack_limits: SlackRateLimits,
    controls: Controls,
    clock: Clock,
) -> Sink:
    match receiver:
        case ConsoleReceiver():
            return ConsoleSink(receiver.name, console)
        case EmailReceiver():
            return EmailSink(receiver, store)
        case PagerDutyReceiver():
            return PagerDutySink(receiver)
        case SlackReceiver():
            return SlackSink(receiver, store, metrics, slack_limits, controls, clock)
        case _:
            assert_never(receiver)

"""Sinks: one per configured receiver. `build_sinks` turns the receivers section into live sinks, `build_previews`
into preview-only ones (no network, no store) for `explain`. `SINK_TYPES` says how for each receiver type: a new
sink type is one entry there."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TextIO, TypeVar

from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import ConsoleReceiver, EmailReceiver, PagerDutyReceiver, Receiver, SlackReceiver
from bot.metrics import Metrics
from bot.pages.links import PageLinks
from bot.render.graph_worker import GraphRenderer
from bot.render.slack import Controls
from bot.sinks.base import DeliveryResult, Preview, Previewer, Sink
from bot.sinks.console import ConsoleSink
from bot.sinks.email import EmailRendering, EmailSink
from bot.sinks.graphs import AlertPictures
from bot.sinks.linked import LinkedPreviewer, LinkedSink
from bot.sinks.pagerduty import PagerDutyRendering, PagerDutySink
from bot.sinks.slack import SlackRateLimits, SlackRendering, SlackSink
from bot.storage.interface import Store

__all__ = [
    "SINK_TYPES",
    "DeliveryResult",
    "Preview",
    "Previewer",
    "Sink",
    "SinkResources",
    "SinkType",
    "build_previews",
    "build_sinks",
]

ReceiverT = TypeVar("ReceiverT")


@dataclass(frozen=True)
class SinkResources:
    """What the live sinks share. `slack_limits`: one pace per Slack channel, whichever receivers post there."""

    store: Store
    metrics: Metrics
    console: TextIO | None
    slack_limits: SlackRateLimits
    # The buttons each Slack receiver's messages may show (none for a receiver not listed).
    slack_controls: Mapping[str, Controls]
    clock: Clock
    # The one graph worker process every receiver's pictures are drawn in.
    graphs: GraphRenderer

    def controls(self, receiver: str) -> Controls:
        return self.slack_controls.get(receiver, Controls())

    def pictures(self, receiver: SlackReceiver | EmailReceiver) -> AlertPictures:
        return AlertPictures(self.store, self.graphs, receiver.graphs, receiver.graph_theme)


@dataclass(frozen=True)
class SinkType(Generic[ReceiverT]):
    """How one receiver type becomes a live sink, and a preview-only one."""

    build: Callable[[ReceiverT, SinkResources], Sink]
    preview: Callable[[ReceiverT], Previewer]


SINK_TYPES: dict[type[Any], SinkType[Any]] = {
    ConsoleReceiver: SinkType[ConsoleReceiver](
        build=lambda receiver, shared: ConsoleSink(receiver.name, shared.console),
        preview=lambda receiver: ConsoleSink(receiver.name),
    ),
    EmailReceiver: SinkType[EmailReceiver](
        build=lambda receiver, shared: EmailSink(receiver, shared.store, shared.pictures(receiver), shared.clock),
        preview=EmailRendering,
    ),
    PagerDutyReceiver: SinkType[PagerDutyReceiver](
        build=lambda receiver, shared: PagerDutySink(receiver, shared.store, clock=shared.clock),
        preview=PagerDutyRendering,
    ),
    SlackReceiver: SinkType[SlackReceiver](
        build=lambda receiver, shared: SlackSink(
            receiver,
            shared.store,
            shared.metrics,
            shared.slack_limits,
            shared.controls(receiver.name),
            shared.clock,
            shared.pictures(receiver),
        ),
        preview=SlackRendering,
    ),
}


def build_sinks(
    receivers: Sequence[Receiver],
    store: Store,
    metrics: Metrics,
    console: TextIO | None = None,
    slack_controls: Mapping[str, Controls] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    links: PageLinks | None = None,
) -> dict[str, Sink]:
    """`slack_controls`: the buttons each Slack receiver's messages may show (none for a receiver not listed);
    `links`: each delivery then carries the link to its page."""
    # Drawing is real CPU time in another process: its bound is on the system clock, whatever `clock` is.
    renderer = GraphRenderer(metrics)
    shared = SinkResources(store, metrics, console, SlackRateLimits(clock), slack_controls or {}, clock, renderer)
    sinks = {receiver.name: SINK_TYPES[type(receiver)].build(receiver, shared) for receiver in receivers}
    if links is None:
        return sinks
    return {name: LinkedSink(sink, links) for name, sink in sinks.items()}


def build_previews(receivers: Sequence[Receiver], links: PageLinks | None = None) -> dict[str, Previewer]:
    """What each receiver would send, rendered by its sink's code; Slack messages are shown without buttons."""
    previews = {receiver.name: SINK_TYPES[type(receiver)].preview(receiver) for receiver in receivers}
    if links is None:
        return previews
    return {name: LinkedPreviewer(previewer, links) for name, previewer in previews.items()}

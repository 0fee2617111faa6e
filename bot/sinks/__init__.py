"""Sinks: one per configured receiver. `build_sinks` turns the receivers section into live sinks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from bot.config import ConsoleReceiver, Receiver
from bot.metrics import Metrics
from bot.sinks.base import DeliveryResult, Sink
from bot.sinks.console import ConsoleSink
from bot.store.base import Store

__all__ = ["DeliveryResult", "Sink", "build_sinks"]


def build_sinks(
    receivers: Sequence[Receiver], store: Store, metrics: Metrics, console: TextIO | None = None
) -> dict[str, Sink]:
    sinks: dict[str, Sink] = {}
    for receiver in receivers:
        if isinstance(receiver, ConsoleReceiver):
            sinks[receiver.name] = ConsoleSink(receiver.name, console)
        else:
            raise NotImplementedError(f"receiver type {receiver.type!r} is not available yet")
    return sinks

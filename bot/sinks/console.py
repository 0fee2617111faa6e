"""Console sink: one JSON line per event on stdout, so the bot works with no accounts at all."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from bot.models import Delivery, short_id
from bot.render.incident_console import incident_facts, incident_sections
from bot.sinks.base import DeliveryResult, Preview


class ConsoleSink:
    def __init__(self, name: str, stream: TextIO | None = None) -> None:
        self.name = name
        self._stream = stream

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        stream = self._stream or sys.stdout
        try:
            stream.write(json.dumps(self._line(delivery), ensure_ascii=False) + "\n")
            stream.flush()
        except OSError as exc:
            return DeliveryResult.retry_later("stdout_error", str(exc))
        return DeliveryResult.ok()

    def preview(self, delivery: Delivery) -> Preview:
        return {"line": self._line(delivery)}

    async def close(self) -> None:
        return None

    @staticmethod
    def _line(delivery: Delivery) -> dict[str, Any]:
        """The event as JSON: `id` is what a person types (`/gpu ack ID` of an alert, `report ID` of an incident)."""
        message = delivery.message
        incident = message.incident
        line = {
            "event": message.event,
            "id": short_id(message.alert_key) if incident is None else incident.id,
            "status": message.status,
            "alertname": message.alertname,
            "severity": message.severity,
            "title": message.title,
            "summary": message.summary,
            "host": message.host,
            "gpu": message.gpu,
            "alert_key": message.alert_key,
            "group_key": message.group_key,
            "starts_at": message.starts_at.isoformat(),
            "resolved_at": message.resolved_at.isoformat() if message.resolved_at else None,
            "times_seen": message.times_seen,
            "labels": message.labels,
            "facts": incident_facts(incident) if incident else {fact.label: fact.value for fact in message.facts},
            "sections": incident_sections(incident) if incident else {s.title: s.lines for s in message.sections},
            "links": {link.text: link.url for link in message.links},
            "event_id": delivery.event_id,
            "delivery_id": delivery.id,
        }
        if message.note:
            line["note"] = message.note
        return line

"""A composed message and its outbox row, as sinks receive them, for sink and renderer tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.message import Fact, Link, Message, Section
from bot.models import Delivery

STARTED = datetime(2026, 11, 29, 13, 31, 59, tzinfo=UTC)


def sample_message(event: str = "firing", **changes: Any) -> Message:
    """An Xid 79 on k-ai-01 GPU 3 with every kind of section, an unsafe link, and enrichment details."""
    status = "resolved" if event == "resolved" else "firing"
    values: dict[str, Any] = {
        "alert_key": f"0123456789abcdef@{STARTED.isoformat()}",
        "fingerprint": "0123456789abcdef",
        "group_key": '{}:{alertname="GPUXidError"}',
        "event": event,
        "status": status,
        "severity": "critical",
        "title": "GPUXidError on k-ai-01 GPU 3",
        "summary": "Xid 79 on GPU 3: fell off the bus",
        "host": "k-ai-01",
        "gpu": "3",
        "alertname": "GPUXidError",
        "starts_at": STARTED,
        "resolved_at": STARTED + timedelta(minutes=12) if status == "resolved" else None,
        "facts": [Fact(label="Host", value="k-ai-01"), Fact(label="GPU", value="3 · NVIDIA H100 80GB HBM3")],
        "sections": [
            Section(title="Judgement", kind="judgement", lines=["Hardware fault: drain the node"]),
            Section(title="What it means", lines=["The GPU stopped answering on PCIe."]),
            Section(title="Kernel log", kind="code", lines=["NVRM: Xid (PCI:0000:3b:00): 79, pid=1234", "second"]),
            Section(title="Runbook", kind="steps", lines=["Drain the node: `kubectl drain k-ai-01`", "Reseat"]),
            Section(title="Prometheus", kind="warning", lines=["Prometheus unavailable: timeout"]),
        ],
        "links": [Link(text="Runbook", url="https://runbooks.example/xid"), Link(text="Sneaky", url="javascript:x")],
        "labels": {"alertname": "GPUXidError", "severity": "critical", "host": "k-ai-01", "gpu": "3"},
        "details": {
            "annotations": {"summary": "Xid 79 on GPU 3: fell off the bus", "description": "more words"},
            "loki": {"entries": [["t", "NVRM: Xid 79"]]},
        },
    }
    values.update(changes)
    return Message(**values)


def delivery_of(message: Message, receiver: str, delivery_id: int = 1) -> Delivery:
    return Delivery(
        id=delivery_id,
        event_id=delivery_id,
        alert_key=message.alert_key,
        receiver=receiver,
        message=message,
        attempts=0,
        created_at=STARTED,
    )

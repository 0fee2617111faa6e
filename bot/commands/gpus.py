"""`gpu-alert-bot gpus`: every GPU's history from the store, one physical GPU per row, with its escalations."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from bot.config import BotConfig
from bot.enrich.recurrence import NONFATAL_SUFFIX, parse_xid_code, xid_history
from bot.gpu.xid_catalog import XidCatalog, XidCatalogError, load_catalog
from bot.gpu.xid_escalation import Verdict, escalate, incidents, window_text
from bot.models import GpuEvent
from bot.store import StoreUnavailable, open_store


@dataclass
class GpuHistory:
    gpu_key: str
    host: str = ""
    uuid: str = ""
    pci_bus_id: str = ""
    xids: dict[str, int] = field(default_factory=dict)
    alerts: dict[str, int] = field(default_factory=dict)
    first: datetime | None = None
    last: datetime | None = None
    verdicts: list[Verdict] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_key": self.gpu_key,
            "host": self.host,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "xids": self.xids,
            "alerts": self.alerts,
            "first": None if self.first is None else self.first.isoformat(),
            "last": None if self.last is None else self.last.isoformat(),
            "verdicts": [v.to_dict() for v in self.verdicts],
        }


def gpu_histories(events: Sequence[GpuEvent], catalog: XidCatalog, now: datetime) -> list[GpuHistory]:
    """One history per physical GPU: records under its UUID and under its host + PCI bus id are joined."""
    groups = _physical_gpus(events)
    histories = []
    for members in groups:
        histories.append(_history_of(members, catalog, now))
    return sorted(histories, key=lambda h: (h.host, h.pci_bus_id, h.uuid, h.gpu_key))


def _physical_gpus(events: Sequence[GpuEvent]) -> list[list[GpuEvent]]:
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def names(event: GpuEvent) -> list[str]:
        found = [f"key:{event.gpu_key}"]
        if event.uuid:
            found.append(f"uuid:{event.uuid.lower()}")
        if event.host and event.pci_bus_id:
            found.append(f"pci:{event.host.lower()}/{event.pci_bus_id}")
        return found

    for event in events:
        first, *others = names(event)
        for other in others:
            parent[root(other)] = root(first)
    groups: dict[str, list[GpuEvent]] = defaultdict(list)
    for event in events:
        groups[root(names(event)[0])].append(event)
    return list(groups.values())


def _history_of(members: list[GpuEvent], catalog: XidCatalog, now: datetime) -> GpuHistory:
    best = max(members, key=lambda e: (bool(e.uuid), bool(e.pci_bus_id), e.at))
    found = incidents(xid_history(members), catalog.burst_window)
    nonfatal: dict[str, int] = defaultdict(int)
    for event in members:
        if event.kind == "xid" and parse_xid_code(event.code) is None:
            nonfatal[event.code] += 1
    alerts: dict[str, set[str]] = defaultdict(set)
    for event in members:
        if event.kind == "alert":
            alerts[event.code].add(event.alert_key)
    return GpuHistory(
        gpu_key=best.gpu_key,
        host=next((e.host for e in members if e.host), ""),
        uuid=next((e.uuid for e in members if e.uuid), ""),
        pci_bus_id=next((e.pci_bus_id for e in members if e.pci_bus_id), ""),
        xids={**{str(code): len(times) for code, times in sorted(found.items())}, **dict(sorted(nonfatal.items()))},
        alerts={name: len(keys) for name, keys in sorted(alerts.items())},
        first=min(e.at for e in members),
        last=max(e.at for e in members),
        verdicts=escalate(xid_history(members), catalog, now),
    )


def format_gpu_table(histories: Sequence[GpuHistory]) -> str:
    header = ("HOST", "GPU", "XIDS", "ALERTS", "LAST")
    rows = [header]
    notes: dict[int, list[str]] = {}
    for history in histories:
        rows.append(
            (
                history.host or "-",
                history.uuid or history.pci_bus_id or history.gpu_key,
                ", ".join(f"{code.replace(NONFATAL_SUFFIX, ' nonfatal')} x{n}" for code, n in history.xids.items())
                or "-",
                ", ".join(f"{name} x{n}" for name, n in history.alerts.items()) or "-",
                "-" if history.last is None else history.last.strftime("%Y-%m-%d %H:%M UTC"),
            )
        )
        if history.verdicts:
            notes[len(rows) - 1] = [v.text for v in history.verdicts]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        lines.extend(f"    ! {text}" for text in notes.get(number, []))
    return "\n".join(lines)


async def gpus_command(config: BotConfig, since_seconds: float, output: str) -> int:
    """`gpu-alert-bot gpus`: each GPU's history from the store, opened read-only (safe beside a running bot)."""
    try:
        catalog = load_catalog(config.playbooks.dir)
    except XidCatalogError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return 2
    try:
        store = await open_store(config.store, read_only=True)
    except StoreUnavailable as exc:
        print(f"cannot open the store {config.store.path}: {exc}", file=sys.stderr)
        return 1
    now = datetime.now(UTC)
    try:
        events = await store.gpu_events(now - timedelta(seconds=since_seconds))
    finally:
        await store.close()
    histories = gpu_histories(events, catalog, now)
    if output == "json":
        for history in histories:
            print(json.dumps(history.to_dict(), ensure_ascii=False))
    elif histories:
        print(format_gpu_table(histories))
    else:
        print(f"No GPU event recorded in the last {window_text(since_seconds)}", file=sys.stderr)
    return 0

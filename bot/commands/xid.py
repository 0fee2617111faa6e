"""`gpu-alert-bot xid [FILE]`: the operator's Xid decoder on the bot's parser and catalog, and `--explain CODE`."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from bot.gpu.nvlink import (
    NVLINK5_XIDS,
    XID_NVLINK_ERROR,
    register_table_text,
)
from bot.gpu.nvrm import XID_RECOVERY_ACTION, XidEvent, parse_kernel_log
from bot.gpu.xid_catalog import (
    DecodedXid,
    EscalationRule,
    XidCatalog,
    XidCatalogError,
    XidEntry,
    decode_events,
    load_catalog,
)
from bot.gpu.xid_escalation import window_text


def explain(entry: XidEntry, catalog: XidCatalog) -> str:
    """A catalog entry as text for a terminal."""
    lines = [f"Xid {entry.code}: {entry.title}", f"  name:       {entry.name}", f"  severity:   {entry.severity}"]
    if entry.severity_if_nonfatal:
        lines.append(f"              ({entry.severity_if_nonfatal} when the line says Nonfatal)")
    if entry.meaning:
        lines.append(f"  meaning:    {entry.meaning}")
    if entry.causes:
        lines.append(f"  causes:     {', '.join(entry.causes)}")
    lines.append(f"  action:     {entry.action}")
    if entry.follow_up:
        lines.append(f"  follow-up:  {entry.follow_up}")
    buckets = [b for b in (entry.nvidia.immediate, entry.nvidia.investigatory) if b]
    if buckets:
        lines.append(f"  NVIDIA:     {' / '.join(buckets)}")
        lines.extend(f"              {b}: {catalog.buckets[b]}" for b in buckets if b in catalog.buckets)
    if entry.application:
        lines.append("  application Xid: NVIDIA's device plugin keeps the GPU healthy")
    if entry.unused_on_datacenter:
        lines.append("  unused on A100/H100/B100/GB200 according to NVIDIA's current catalog")
    rules = [rule for rule in catalog.escalations if rule.covers(entry.code, catalog) or entry.code in rule.followed_by]
    for rule in rules:
        lines.append(f"  escalation: {_rule_text(rule)}")
    if entry.code == XID_RECOVERY_ACTION:
        for recovery in catalog.recovery_actions:
            lines.append(f"  0x{recovery.value:X} {' / '.join(recovery.names)}: {recovery.action}")
    if entry.code == XID_NVLINK_ERROR:
        lines.extend(register_table_text(catalog.nvlink_registers))
    if entry.code in NVLINK5_XIDS:
        lines.append(
            "  decode:     the line's unit, link and Fatal/Nonfatal token are shown; the advice follows the token "
            "(NVIDIA's Xid 144-150 subcode sheet is not bundled)"
        )
    if entry.notes:
        lines.append("  notes:")
        lines.extend(f"    - {note}" for note in entry.notes)
    if entry.sources:
        lines.append("  sources:")
        lines.extend(f"    - {source}" for source in entry.sources)
    return "\n".join(lines)


def _rule_text(rule: EscalationRule) -> str:
    what = ", ".join(f"Xid {x}" for x in rule.xids) or f"any {'/'.join(rule.severities)} Xid"
    if rule.followed_by:
        followers = " or ".join(str(x) for x in rule.followed_by)
        return f"{what} followed by Xid {followers} within {window_text(rule.window)} ({rule.id})"
    return f"{what} {rule.count} times on one GPU within {window_text(rule.window)} ({rule.id})"


_TABLE_COLUMNS = ("TIME", "PCI BUS ID", "XID", "SEVERITY", "COUNT", "PROCESS", "NAME / ACTION")


def format_table(decoded: Sequence[DecodedXid]) -> str:
    """Events as an aligned table for people; the action goes under each row."""
    rows = [_TABLE_COLUMNS]
    actions: list[str] = []
    for item in decoded:
        event = item.event
        when = event.timestamp.isoformat() if event.timestamp is not None else event.log_time or _uptime(event)
        process = event.process or ""
        if event.pid is not None:
            process = f"{process}[{event.pid}]"
        rows.append(
            (
                when,
                event.pci_bus_id or "?",
                str(event.xid),
                item.severity,
                str(event.count),
                process or "-",
                item.entry.title,
            )
        )
        actions.append(item.action)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_TABLE_COLUMNS) - 1)]

    def line(row: tuple[str, ...]) -> str:
        return "".join(cell.ljust(width + 2) for cell, width in zip(row, widths, strict=False)) + row[-1]

    indent = " " * (sum(widths) + 2 * len(widths))
    lines = [line(rows[0])]
    for row, action, item in zip(rows[1:], actions, decoded, strict=True):
        lines.extend((line(row), f"{indent}-> {action}"))
        lines.extend(f"{indent}   {detail}" for detail in item.details)
    return "\n".join(lines)


def _uptime(event: XidEvent) -> str:
    return f"+{event.uptime:.3f}s" if event.uptime is not None else "-"


# --- `gpu-alert-bot xid [FILE]` --------------------------------------------------------------------------
def xid_command(path: Path | None, output: str | None, explain_code: int | None, catalog_path: Path | None) -> int:
    """Decode the Xids of kernel log text (a file, or standard input): JSON lines unless `output` is "table".
    Or explain one code: text unless `output` is "json". Returns the exit status."""
    try:
        catalog = load_catalog(catalog_path)
    except XidCatalogError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return 2
    if explain_code is not None:
        return _explain_command(catalog, explain_code, output)
    try:
        with _open_log(path) as stream:
            report = parse_kernel_log((None, line) for line in stream)
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return 1
    decoded = decode_events(report.events, catalog)
    if output == "table":
        if decoded:
            print(format_table(decoded))
        print(f"{len(decoded)} Xid event(s) in {report.nvrm_lines} NVRM line(s)", file=sys.stderr)
    else:
        for item in decoded:
            print(json.dumps(item.to_dict(), ensure_ascii=False))
    return 0


def _explain_command(catalog: XidCatalog, code: int, output: str | None) -> int:
    entry = catalog.get(code)
    if entry is None:
        print(f"Xid {code} is not in the catalog; see https://docs.nvidia.com/deploy/xid-errors/", file=sys.stderr)
        return 1
    if output == "json":
        print(json.dumps(entry.model_dump(mode="json", exclude={"known"}), ensure_ascii=False))
    else:
        print(explain(entry, catalog))
    return 0


@contextmanager
def _open_log(path: Path | None) -> Iterator[TextIO]:
    """The log as text; bytes that are not UTF-8 are replaced rather than failing the whole read."""
    if path is None or str(path) == "-":
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        try:
            yield stdin
        finally:
            stdin.detach()  # standard input stays open for whoever owns it
        return
    with path.open(encoding="utf-8", errors="replace") as stream:
        yield stream

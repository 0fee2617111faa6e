"""Escalation over one GPU's history: the catalog's rules (thresholds in the catalog, not here) turn the Xids a
GPU had into verdicts such as "third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA"."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bot.datafile import XidCatalogError as XidCatalogError  # what `load_catalog` raises: part of this API
from bot.gpu.xid_catalog import EscalationRule, Severity, XidCatalog

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


@dataclass(frozen=True)
class Verdict:
    rule: str
    xid: int
    count: int
    severity: Severity
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "xid": self.xid, "count": self.count, "severity": self.severity, "text": self.text}


def escalate(
    history: Iterable[tuple[int, datetime]],
    catalog: XidCatalog,
    now: datetime,
    codes: Collection[int] | None = None,
) -> list[Verdict]:
    """Apply the catalog's escalation rules to one GPU's Xid history ((code, time) pairs).

    Only rules about `codes` (the Xids of the alert at hand) are checked, so an old pattern does not
    re-escalate on every unrelated alert; None checks them all.
    """
    found = incidents(history, catalog.burst_window)
    verdicts: list[Verdict] = []
    for rule in catalog.escalations:
        if rule.followed_by:
            verdicts.extend(_sequence_verdicts(rule, found, now, codes))
        else:
            verdicts.extend(_count_verdicts(rule, found, now, codes, catalog))
    return verdicts


def incidents(history: Iterable[tuple[int, datetime]], burst_seconds: float) -> dict[int, list[datetime]]:
    """Per code, the times of its incidents: occurrences within the burst window of the previous are one."""
    times: dict[int, list[datetime]] = defaultdict(list)
    for code, at in history:
        times[code].append(at)
    burst = timedelta(seconds=burst_seconds)
    found: dict[int, list[datetime]] = {}
    for code, moments in times.items():
        kept: list[datetime] = []
        for moment in sorted(moments):
            if not kept or moment - kept[-1] > burst:
                kept.append(moment)
        found[code] = kept
    return found


def _count_verdicts(
    rule: EscalationRule,
    found: dict[int, list[datetime]],
    now: datetime,
    codes: Collection[int] | None,
    catalog: XidCatalog,
) -> list[Verdict]:
    since = now - timedelta(seconds=rule.window)
    verdicts = []
    for code in sorted(found):
        if (codes is not None and code not in codes) or not rule.covers(code, catalog):
            continue
        count = sum(1 for at in found[code] if since <= at <= now)
        if count >= rule.count:
            text = _render(rule, xid=code, count=count, next_xid=None)
            verdicts.append(Verdict(rule.id, code, count, rule.severity, text))
    return verdicts


def _sequence_verdicts(
    rule: EscalationRule, found: dict[int, list[datetime]], now: datetime, codes: Collection[int] | None
) -> list[Verdict]:
    if codes is not None and not set(codes) & (set(rule.xids) | set(rule.followed_by)):
        return []
    window = timedelta(seconds=rule.window)
    for first in rule.xids:
        for follower in rule.followed_by:
            for started in found.get(first, []):
                followed = [at for at in found.get(follower, []) if started <= at <= started + window]
                if followed and followed[-1] >= now - window:
                    text = _render(rule, xid=first, count=1, next_xid=follower)
                    return [Verdict(rule.id, first, 1, rule.severity, text)]
    return []


def _render(rule: EscalationRule, *, xid: int, count: int, next_xid: int | None) -> str:
    text = rule.verdict.format(
        nth=ordinal(count), xid=xid, count=count, window=window_text(rule.window), next=next_xid or ""
    )
    return text[:1].upper() + text[1:]


def ordinal(number: int) -> str:
    if 1 <= number <= len(_ORDINALS):
        return _ORDINALS[number - 1]
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def window_text(seconds: float) -> str:
    """A window as people say it: 30 days, 24 h, 15 min."""
    whole = int(seconds)
    if whole >= 2 * 86400 and whole % 86400 == 0:
        return f"{whole // 86400} days"
    if whole >= 3600 and whole % 3600 == 0:
        return f"{whole // 3600} h"
    if whole >= 60 and whole % 60 == 0:
        return f"{whole // 60} min"
    return f"{whole} s"

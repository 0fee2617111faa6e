"""Correlated signals: how a playbook's fleet-wide signal changed over the window before the incident started,
on the affected hosts and on the rest of the fleet.

One range query for all of a playbook's signals and the whole fleet (each signal's series told apart by the label
`incident_signal`, which label_replace adds), two points: the window's start and the incident's start. A host's
change is the difference (the median when its query gives it several series); the signal moved on a host when
that change reaches the playbook's `rise` (or `drop`). Medians, not means: one broken sensor moves neither side.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence

from bot.enrich.prometheus.client import RawSeries
from bot.incident.fleet import Fleet
from bot.incident.model import Signal
from bot.playbooks.incident import SignalSpec

SIGNAL_LABEL = "incident_signal"


def signals_query(signals: Mapping[str, SignalSpec]) -> str:
    """One PromQL expression answering every signal, each series labelled with its signal's name."""
    return " or ".join(
        f'label_replace(({spec.query}), "{SIGNAL_LABEL}", "{name}", "", "")' for name, spec in signals.items()
    )


def by_signal(rows: Sequence[RawSeries]) -> dict[str, list[RawSeries]]:
    split: dict[str, list[RawSeries]] = {}
    for row in rows:
        labels = dict(row.labels)
        name = labels.pop(SIGNAL_LABEL, "")
        split.setdefault(name, []).append(RawSeries(labels, row.samples))
    return split


def host_changes(rows: Sequence[RawSeries], fleet: Fleet) -> dict[str, float]:
    """host -> the change of its series over the window (the answer of a range query whose step is the window:
    a value at its start and one at its end; a series missing either is left out)."""
    changes: dict[str, list[float]] = {}
    for row in rows:
        values = [v for _, v in sorted(row.samples) if math.isfinite(v)]
        host = fleet.resolve(row.labels)
        if len(values) >= 2 and host:
            changes.setdefault(host, []).append(values[-1] - values[0])
    return {host: statistics.median(values) for host, values in changes.items()}


def compare(
    name: str, spec: SignalSpec, changes: dict[str, float], affected: Collection[str], fleet: Fleet, window: float
) -> Signal | None:
    """The signal on the affected hosts against the rest of the fleet (every other host with data when the
    fleet is not known); None when it did not move with them: no affected host has data, its median change on them
    is short of the playbook's rise (or drop), or the rest of the fleet moved as much."""
    hit = [changes[host] for host in affected if host in changes]
    if not hit:
        return None
    others = set(changes) - set(affected)
    if fleet.hosts:
        others &= set(fleet.hosts)
    rest = statistics.median([changes[host] for host in others]) if others else None
    change = statistics.median(hit)
    if not spec.moved(change) or (rest is not None and not spec.beyond(change, rest)):
        return None
    return Signal(
        name=name,
        title=spec.title,
        unit=spec.unit,
        window_seconds=window,
        moved=sum(1 for one in hit if spec.moved(one)),
        affected_total=len(hit),
        affected_change=change,
        rest_change=rest,
    )

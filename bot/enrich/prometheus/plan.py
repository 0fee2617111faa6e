"""The Prometheus queries of one batch of alerts, and each alert's part of their answers.

- History: the alerts of one rule expression (and one step) share one `query_range` over their windows, narrowed
  to their series by their identity labels (bot/enrich/prometheus/scope.py); each alert takes its own series by
  its labels, and its own window's samples. An alert whose series is not in the narrowed answer (a label the
  series lacks) reads the whole expression's answer, one more query shared by the rule's alerts.
- Related queries: one query per template for up to 50 hosts (placeholders' matchers made regex alternations,
  bot/querytemplate.py's `fill_shared`); a template that cannot be shared is sent per alert, identical ones once.
- GPU inventory: one instant query for up to 50 hosts, its rows split per host.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from bot.enrich.batch import SharedQueries, chunks
from bot.enrich.prometheus.client import PrometheusClient, RawSeries, choose_step
from bot.enrich.prometheus.scope import grouped, scope_labels, scoped
from bot.enrich.queryapi import Deadline
from bot.message import format_duration
from bot.models import DEFAULT_HOST_LABELS, AlertState, host_from_labels
from bot.querytemplate import SharedQuery, TemplateError, fill_query, fill_shared, quoted, regex_literal

INVENTORY_METRIC = "DCGM_FI_DEV_GPU_TEMP"
# Labels that name an alert's series (its host, its GPU): never a rule's own label, so safe to select by.
SCOPE_LABELS = (*DEFAULT_HOST_LABELS, "gpu", "UUID", "uuid", "pci_bus_id")
# dcgm-exporter's workload labels: Kubernetes pod attribution (the older names too) and the HPC job mapping.
WORKLOAD_LABELS = ("pod", "namespace", "container", "pod_name", "pod_namespace", "container_name", "hpc_job")
# Marks the inventory rows of series present now (the others were seen within the history window only).
CURRENT = "bot_current"
_INVENTORY_LABELS = ", ".join(
    ("gpu", "UUID", "uuid", "pci_bus_id", "modelName", "Hostname", "hostname", "instance", *WORKLOAD_LABELS, CURRENT)
)


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    step: float

    @property
    def span(self) -> str:
        return format_duration(self.end - self.start)


def alert_window(alert: AlertState, now: float, history: float) -> Window:
    start = (alert.starts_at - timedelta(seconds=history)).timestamp()
    end = max(now, start + 60)
    step = choose_step(start, end)
    # Prometheus evaluates at start, start + step, ...: anchor the grid on `end` so the newest point is now.
    return Window(end - step * math.ceil((end - start) / step), end, step)


def within(series: RawSeries, window: Window) -> RawSeries:
    """The samples of a shared answer that fall in one alert's window (the grid is the same)."""
    return replace(series, samples=[s for s in series.samples if s[0] >= window.start - 1e-6])


@dataclass
class _Group:
    """One shared query and its window: a range query, or an instant one at `end` (the GPU inventory)."""

    query: str
    start: float
    end: float
    step: float
    # The labels the query was narrowed by (history only): each alert's series have the alert's values of them.
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class RelatedNeed:
    """How one alert reads one related query: its own filled query, and the shared one it is part of."""

    own: str
    group: _Group
    shared: SharedQuery | None
    values: Mapping[str, str]


@dataclass
class BatchQueries:
    """The batch's queries, started the first time an alert needs each, and each alert's way to its part."""

    client: PrometheusClient
    cache: SharedQueries
    timeout: float
    windows: dict[str, Window] = field(default_factory=dict)
    history: dict[str, _Group] = field(default_factory=dict)
    related: dict[tuple[str, str], RelatedNeed | TemplateError] = field(default_factory=dict)
    inventory: dict[str, _Group] = field(default_factory=dict)
    _splits: dict[int, dict[Hashable, list[RawSeries]]] = field(default_factory=dict)

    def start(self) -> None:
        """Send every query the batch needs now, each once, rather than when its first reader gets to it."""
        for group in {id(g): g for g in self.history.values()}.values():
            self.range(group)
        for group in {id(n.group): n.group for n in self.related.values() if isinstance(n, RelatedNeed)}.values():
            self.range(group)
        for group in {id(g): g for g in self.inventory.values()}.values():
            self.instant(group)

    def range(self, group: _Group) -> asyncio.Task[list[RawSeries]]:
        key: Hashable = ("range", group.query, group.start, group.end, group.step)
        return self.cache.get(
            key, self.timeout, lambda d: self.client.query_range(group.query, group.start, group.end, group.step, d)
        )

    def instant(self, group: _Group) -> asyncio.Task[list[RawSeries]]:
        key: Hashable = ("instant", group.query, group.end)
        return self.cache.get(key, self.timeout, lambda d: self._instant(group, d))

    async def _instant(self, group: _Group, deadline: Deadline) -> list[RawSeries]:
        return await self.client.query(group.query, group.end, deadline)

    def split(
        self, group: _Group, answer: list[RawSeries], by: Callable[[RawSeries], Iterable[Hashable]]
    ) -> dict[Hashable, list[RawSeries]]:
        """The answer indexed once per group (by scope labels, by host), for every alert reading it."""
        index: dict[Hashable, list[RawSeries]] | None = self._splits.get(id(group))
        if index is None:
            index = {}
            for series in answer:
                for key in by(series):
                    index.setdefault(key, []).append(series)
            self._splits[id(group)] = index
        return index


def history_groups(alerts: Sequence[tuple[AlertState, str]], windows: Mapping[str, Window]) -> dict[str, _Group]:
    """(alert, graphed query) pairs -> one group per graphed query and grid, keyed by alert."""
    grouped: dict[tuple[str, float, float], list[AlertState]] = {}
    for alert, query in alerts:
        window = windows[alert.key]
        grouped.setdefault((query, window.step, window.end), []).append(alert)
    groups: dict[str, _Group] = {}
    for (query, step, end), members in grouped.items():
        labels = [name for name in SCOPE_LABELS if all(a.labels.get(name) for a in members)]
        allowed = tuple(scope_labels(query, labels))
        matchers = {name: [a.labels[name] for a in members] for name in allowed}
        start = min(windows[a.key].start for a in members)
        group = _Group(scoped(query, matchers), start, end, step, allowed)
        for alert in members:
            groups[alert.key] = group
    return groups


def unscoped(group: _Group, graphed: str) -> _Group:
    return _Group(graphed, group.start, group.end, group.step)


def related_needs(
    alerts: Sequence[AlertState], templates: Mapping[str, Mapping[str, str]], windows: Mapping[str, Window]
) -> dict[tuple[str, str], RelatedNeed | TemplateError]:
    """`templates`: alert key -> its playbook's related queries (name -> template)."""
    needs: dict[tuple[str, str], RelatedNeed | TemplateError] = {}
    grouped: dict[tuple[str, str, float, float], list[tuple[AlertState, dict[str, str], str]]] = {}
    for alert in alerts:
        values = related_values(alert)
        window = windows[alert.key]
        for name, template in templates.get(alert.key, {}).items():
            try:
                own = fill_query(template, values)
            except TemplateError as exc:
                needs[(alert.key, name)] = exc
                continue
            grouped.setdefault((name, template, window.step, window.end), []).append((alert, values, own))
    for (name, template, step, end), members in grouped.items():
        for chunk in _host_chunks(members):
            shared = _shared(template, chunk)
            start = min(windows[a.key].start for a, _, _ in chunk)
            if len({own for _, _, own in chunk}) == 1:
                # One query for all (one alert, or one host's): exactly the query each would send alone.
                group = _Group(chunk[0][2], start, end, step)
                needs.update({(a.key, name): RelatedNeed(own, group, None, values) for a, values, own in chunk})
                continue
            if shared is None:
                for alert, values, own in chunk:
                    needs[(alert.key, name)] = RelatedNeed(own, _Group(own, start, end, step), None, values)
                continue
            group = _Group(shared.query, start, end, step)
            for alert, values, own in chunk:
                needs[(alert.key, name)] = RelatedNeed(own, group, shared, values)
    return needs


def _shared(template: str, chunk: list[tuple[AlertState, dict[str, str], str]]) -> SharedQuery | None:
    """The template filled for the whole chunk, when each alert's series can be told apart in the answer: its
    aggregations grouped by the matched labels (`max(x{host="a"})` -> `max by (host) (x{host=~"a|b"})`), or,
    for a regex matcher (which may select several values per alert), no aggregation that drops the label."""
    shared = fill_shared(template, [values for _, values, _ in chunk])
    if shared is None:
        return None
    labels = sorted({label for label, _, _ in shared.matchers})
    if any(op == "=~" for _, op, _ in shared.matchers):
        return shared if scope_labels(shared.query, labels) == labels else None
    query = grouped(shared.query, labels)
    return None if query is None else replace(shared, query=query)


def related_values(alert: AlertState) -> dict[str, str]:
    values = dict(alert.labels)
    host = host_from_labels(alert.labels)
    if host:
        values.setdefault("host", host)
    return values


def _host_chunks(members: list[Any]) -> list[list[Any]]:
    by_host: dict[str, list[Any]] = {}
    for member in members:
        by_host.setdefault(host_from_labels(member[0].labels), []).append(member)
    return [[m for host in hosts for m in by_host[host]] for hosts in chunks(sorted(by_host))]


def inventory_groups(hosts: Mapping[str, str], windows: Mapping[str, Window], history: float) -> dict[str, _Group]:
    """`hosts`: alert key -> host (alerts naming a host only) -> one instant query per 50 hosts and moment."""
    by_end: dict[float, set[str]] = {}
    for key, host in hosts.items():
        by_end.setdefault(windows[key].end, set()).add(host)
    per_host: dict[tuple[float, str], _Group] = {}
    for end, names in by_end.items():
        for chunk in chunks(sorted(names)):
            group = _Group(inventory_query(chunk, history), end, end, 0.0)
            per_host.update({(end, host): group for host in chunk})
    return {key: per_host[(windows[key].end, host)] for key, host in hosts.items()}


def inventory_query(hosts: Sequence[str], history: float) -> str:
    lookback = f"[{int(history)}s]"
    names = _one_of(hosts)
    selectors = [
        f"{{Hostname{names}}}",
        f"{{hostname{names}}}",
        f"{{instance=~{quoted(_instance_regex(hosts))}}}",
    ]
    # The series present now first, marked; then every series of the window (never equal to a marked one).
    now = [f'label_replace({INVENTORY_METRIC}{s}, "{CURRENT}", "1", "", "")' for s in selectors]
    window = [f"last_over_time({INVENTORY_METRIC}{s}{lookback})" for s in selectors]
    return f"count by ({_INVENTORY_LABELS}) (" + " or ".join(now + window) + ")"


def _one_of(hosts: Sequence[str]) -> str:
    return f"={quoted(hosts[0])}" if len(hosts) == 1 else f"=~{quoted(_regex_of(hosts))}"


def _instance_regex(hosts: Sequence[str]) -> str:
    """An `instance` of one of the hosts, with or without a port: an IPv6 address is bracketed before its port
    (`[fd00::7]:9400`), as Prometheus writes a target."""
    names = [regex_literal(h) for h in hosts] + [rf"\[{regex_literal(h)}\]" for h in hosts if ":" in h]
    return (names[0] if len(names) == 1 else "(?:" + "|".join(names) + ")") + "(:[0-9]+)?"


def _regex_of(hosts: Sequence[str]) -> str:
    return regex_literal(hosts[0]) if len(hosts) == 1 else "(?:" + "|".join(regex_literal(h) for h in hosts) + ")"


def inventory_host(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The names an inventory row gives its host (one of them is the host it was asked for)."""
    instance = host_from_labels(dict(labels), ("instance",))
    return tuple(v for v in (labels.get("Hostname"), labels.get("hostname"), instance) if v)

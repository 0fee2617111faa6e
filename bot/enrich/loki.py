"""Kernel log evidence: the `NVRM:` lines Loki holds for the alert's host around the time the alert started.

One `query_range` per group of up to 50 hosts of a batch (the selector's `host="{host}"` made `host=~"a|b|..."`),
its lines split per host by their streams' labels, and `limit` lines asked per host. Alerts for a host whose
windows fall inside one already fetched (or being fetched) share its answer for `cache_ttl`, so 64 Xid alerts on
8 hosts cost one query. This enricher only fetches lines; decoding them (Xid, PCI address, process) is the `xid`
enricher's job.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field, ValidationError

from bot.config import LokiSource
from bot.enrich.base import EnrichmentRequest
from bot.enrich.batch import Batch, chunks, query_slot, shared
from bot.enrich.queryapi import Deadline, QueryError, bearer_auth, body_text, send
from bot.evidence import EnrichmentSection, LokiEvidence
from bot.models import host_from_labels
from bot.querytemplate import SharedQuery, TemplateError, fill_query, fill_shared, quoted

log = logging.getLogger(__name__)

QUERY_RANGE_PATH = "/loki/api/v1/query_range"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NS = 1_000_000_000
# Fetched windows are widened by a minute each side, so alerts of one incident (starting seconds apart) fit.
_SHARE_MARGIN_NS = 60 * _NS
_FAILURE_TTL = 5.0
_MAX_LINE_CHARS = 400


class _Stream(BaseModel):
    stream: dict[str, str]
    values: list[tuple[str, str] | tuple[str, str, dict[str, Any]]]


class _Data(BaseModel):
    result_type: Literal["streams"] = Field(alias="resultType")
    result: list[_Stream]


class _Response(BaseModel):
    status: Literal["success"]
    data: _Data


@dataclass(frozen=True)
class LokiResult:
    """Log lines of one query, oldest first, merged across streams; `truncated` when `limit` was reached."""

    entries: list[tuple[int, str]]
    truncated: bool


def to_ns(moment: datetime) -> int:
    return ((moment - _EPOCH) // timedelta(microseconds=1)) * 1000


def from_ns(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=ns // 1000)


class LokiClient:
    """`GET /loki/api/v1/query_range` for log queries (httpx, retries within the caller's deadline)."""

    def __init__(self, config: LokiSource, transport: httpx.AsyncBaseTransport | None = None) -> None:
        tenant = {"X-Scope-OrgID": config.tenant_id} if config.tenant_id else {}
        self._client = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            headers=tenant,
            auth=bearer_auth(config.bearer_token_file),
            transport=transport,
        )

    async def query_range(
        self,
        query: str,
        start_ns: int,
        end_ns: int,
        *,
        limit: int,
        deadline: Deadline,
        direction: Literal["backward", "forward"] = "backward",
    ) -> LokiResult:
        """Lines in [start, end) (Loki's end is exclusive); with `backward`, the newest `limit` of them."""
        streams = await self.query_streams(query, start_ns, end_ns, limit=limit, deadline=deadline, direction=direction)
        return merged([entries for _, entries in streams], limit)

    async def query_streams(
        self,
        query: str,
        start_ns: int,
        end_ns: int,
        *,
        limit: int,
        deadline: Deadline,
        direction: Literal["backward", "forward"] = "backward",
    ) -> list[tuple[dict[str, str], list[tuple[int, str]]]]:
        """Each stream's labels and lines (oldest first), for a query that spans several hosts."""
        params = {
            "query": query,
            "start": str(start_ns),
            "end": str(end_ns),
            "limit": str(limit),
            "direction": direction,
        }
        response = await send(
            self._client, "GET", QUERY_RANGE_PATH, deadline, service="Loki", error_text=body_text, params=params
        )
        return _streams(response, newest_first=direction == "backward")

    async def close(self) -> None:
        await self._client.aclose()


def merged(streams: list[list[tuple[int, str]]], limit: int, total: int | None = None) -> LokiResult:
    """Streams' lines as one oldest-first list; truncated when the query's answer (`total` lines) hit `limit`."""
    entries = list(heapq.merge(*streams, key=_timestamp))
    return LokiResult(entries=entries, truncated=(len(entries) if total is None else total) >= limit)


def _streams(response: httpx.Response, newest_first: bool) -> list[tuple[dict[str, str], list[tuple[int, str]]]]:
    """Each stream's lines, oldest first. Lines with the same timestamp keep Loki's order (a multi-line kernel
    message is often logged within one timestamp), so the sort is stable on the timestamp alone."""
    try:
        parsed = _Response.model_validate_json(response.content)
        return [
            (
                s.stream,
                sorted(((int(v[0]), v[1]) for v in (reversed(s.values) if newest_first else s.values)), key=_timestamp),
            )
            for s in parsed.data.result
        ]
    except (ValidationError, ValueError):
        detail = f"Loki answered something that is not a log query result: {body_text(response)}"
        raise QueryError("malformed", detail) from None


def _timestamp(entry: tuple[int, str]) -> int:
    return entry[0]


@dataclass
class _Fetch:
    """One query for a group of hosts, in flight or answered, that alerts of the same incident share."""

    start_ns: int
    end_ns: int
    started: datetime
    task: asyncio.Task[dict[str, LokiResult]]
    expires: float = field(default=float("inf"))

    def covers(self, start_ns: int, end_ns: int, alert_start: datetime) -> bool:
        # Reused only if it was sent after the alert started: an older answer may lack the lines behind it.
        return self.start_ns <= start_ns and end_ns <= self.end_ns and self.started >= alert_start


class LokiEnricher:
    name = "loki"
    title = "Kernel log (Loki)"
    source = "Loki"

    def __init__(self, config: LokiSource, timeout: float, client: LokiClient | None = None) -> None:
        self._config = config
        self._timeout = timeout
        self._client = client or LokiClient(config)
        self._fetches: dict[str, list[_Fetch]] = {}
        self._slots = asyncio.Semaphore(config.max_concurrent_queries)

    async def enrich(self, request: EnrichmentRequest) -> EnrichmentSection:
        alert = request.alert
        host = self._host(alert.labels)
        if not host:
            labels = ", ".join(self._config.host_labels)
            return EnrichmentSection.skipped(self.name, self.title, f"the alert has none of the labels {labels}")
        start = alert.starts_at - timedelta(seconds=self._config.before)
        end = alert.starts_at + timedelta(seconds=self._config.after)
        try:
            query = self.query_for(host)
        except TemplateError as exc:
            return EnrichmentSection.unavailable(self.name, self.title, f"enrichment.loki.selector: {exc}")
        fetches = await request.batch.plan(self.name, lambda: self._plan(request.batch))
        try:
            result = (await shared(fetches[alert.key].task))[host]
        except QueryError as exc:
            return EnrichmentSection.unavailable(self.name, self.title, exc.detail)
        return self._section(host, query, start, end, result)

    def query_for(self, host: str) -> str:
        return self._with_filter(fill_query(self._config.selector, {"host": host}))

    def _with_filter(self, query: str) -> str:
        if self._config.line_filter:
            query += f" |= {quoted(self._config.line_filter)}"
        return query

    def _host(self, labels: dict[str, str]) -> str:
        host = host_from_labels(labels, self._config.host_labels)
        return self._config.host_map.get(host, host) if host else ""

    async def _plan(self, batch: Batch) -> dict[str, _Fetch]:
        """The fetch each alert of the batch reads: one already covering its window, or one of the new queries,
        one per group of hosts."""
        self._forget_expired()
        fetches: dict[str, _Fetch] = {}
        wanted: dict[str, list[tuple[str, int, int]]] = {}
        for item in batch.items:
            alert = item.alert
            host = self._host(alert.labels)
            if not host:
                continue
            start_ns = to_ns(alert.starts_at - timedelta(seconds=self._config.before))
            end_ns = to_ns(alert.starts_at + timedelta(seconds=self._config.after))
            known = next((f for f in self._fetches.get(host, []) if f.covers(start_ns, end_ns, alert.starts_at)), None)
            if known is not None:
                fetches[alert.key] = known
            else:
                wanted.setdefault(host, []).append((alert.key, start_ns, end_ns))
        for group in self._host_groups(sorted(wanted)):
            windows = [w for host in group for w in wanted[host]]
            fetch = self._fetch(group, min(w[1] for w in windows), max(w[2] for w in windows), batch.now)
            fetches.update({key: fetch for key, _, _ in windows})
        return fetches

    def _host_groups(self, hosts: list[str]) -> list[list[str]]:
        """Hosts asked together: 50 to a query, or one each when the selector cannot be shared."""
        try:
            shareable = len(hosts) < 2 or bool(fill_shared(self._config.selector, [{"host": h} for h in hosts[:2]]))
        except TemplateError:
            shareable = False
        return chunks(hosts) if shareable else [[host] for host in hosts]

    def _fetch(self, hosts: list[str], start_ns: int, end_ns: int, sent_at: datetime) -> _Fetch:
        wide_start = (start_ns - _SHARE_MARGIN_NS) // _SHARE_MARGIN_NS * _SHARE_MARGIN_NS
        wide_end = -(-(end_ns + _SHARE_MARGIN_NS) // _SHARE_MARGIN_NS) * _SHARE_MARGIN_NS
        task = asyncio.create_task(self._query(hosts, wide_start, wide_end), name=f"loki-{hosts[0]}")
        fetch = _Fetch(wide_start, wide_end, sent_at, task)
        task.add_done_callback(lambda done: self._answered(hosts, fetch, done))
        for host in hosts:
            self._fetches.setdefault(host, []).append(fetch)
        return fetch

    async def _query(self, hosts: list[str], start_ns: int, end_ns: int) -> dict[str, LokiResult]:
        """Each host's lines; `limit` lines per host, at most `max_lines_per_query` in all."""
        values = [{"host": host} for host in hosts]
        shared = fill_shared(self._config.selector, values) if len(hosts) > 1 else None
        query = self._with_filter(shared.query) if shared is not None else self.query_for(hosts[0])
        limit = min(self._config.limit * len(hosts), max(self._config.limit, self._config.max_lines_per_query))
        deadline = Deadline(self._timeout)
        async with query_slot(self._slots, deadline):
            streams = await self._client.query_streams(query, start_ns, end_ns, limit=limit, deadline=deadline)
        total = sum(len(entries) for _, entries in streams)
        return {
            host: merged([e for labels, e in streams if _of_host(shared, labels, one)], limit, total)
            for host, one in zip(hosts, values, strict=True)
        }

    def _answered(self, hosts: list[str], fetch: _Fetch, task: asyncio.Task[dict[str, LokiResult]]) -> None:
        failure = None if task.cancelled() else task.exception()
        if isinstance(failure, QueryError):
            log.warning(
                "loki query failed", extra={"reason": failure.reason, "detail": failure.detail, "hosts": len(hosts)}
            )
        # A failure is shared briefly too, so a storm of alerts does not hammer a Loki that is down.
        ttl = _FAILURE_TTL if task.cancelled() or failure is not None else self._config.cache_ttl
        fetch.expires = asyncio.get_running_loop().time() + ttl

    def _forget_expired(self) -> None:
        now = asyncio.get_running_loop().time()
        for host, fetches in list(self._fetches.items()):
            alive = [f for f in fetches if f.expires > now]
            if alive:
                self._fetches[host] = alive
            else:
                del self._fetches[host]

    def _section(self, host: str, query: str, start: datetime, end: datetime, result: LokiResult) -> EnrichmentSection:
        start_ns, end_ns = to_ns(start), to_ns(end)
        entries = [(ns, line) for ns, line in result.entries if start_ns <= ns < end_ns]
        # Loki kept the newest `limit` lines of the wider window: older lines of this window may be missing.
        truncated = result.truncated and (not result.entries or result.entries[0][0] > start_ns)
        shown = entries[-self._config.show_lines :] if self._config.show_lines else []
        return EnrichmentSection(
            name=self.name,
            title=self.title,
            status="ok",
            summary=self._summary(host, start, end, len(entries), len(shown), truncated),
            lines=[f"{from_ns(ns):%H:%M:%S.%f}"[:-3] + f" {_cut(line)}" for ns, line in shown],
            data=LokiEvidence(
                host=host,
                query=query,
                start=start.astimezone(UTC).isoformat(),
                end=end.astimezone(UTC).isoformat(),
                entries=[(from_ns(ns).isoformat(), line) for ns, line in entries],
                truncated=truncated,
            ),
        )

    def _summary(self, host: str, start: datetime, end: datetime, found: int, shown: int, truncated: bool) -> str:
        span = f"{start.astimezone(UTC):%H:%M}-{end.astimezone(UTC):%H:%M} UTC"
        what = f'matching "{self._config.line_filter}" ' if self._config.line_filter else ""
        if not found:
            return f"No line {what}for {host}, {span}"
        text = f"{found} line{'s' if found != 1 else ''} {what}for {host}, {span}"
        if truncated:
            text += f" (truncated: Loki's limit of {self._config.limit} reached, newest kept)"
        if shown < found:
            text += f"; last {shown} shown"
        return text

    async def close(self) -> None:
        tasks = list({id(f.task): f.task for fetches in self._fetches.values() for f in fetches}.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._fetches.clear()
        await self._client.close()


def _of_host(shared: SharedQuery | None, labels: dict[str, str], values: dict[str, str]) -> bool:
    return shared is None or shared.selects(labels, values)


def _cut(line: str) -> str:
    line = line.rstrip("\n")
    return line if len(line) <= _MAX_LINE_CHARS else line[: _MAX_LINE_CHARS - 1] + "…"

"""A loopback fake of Loki's query API, speaking what grafana/loki documents (protocols.md section 4).

`GET|POST /loki/api/v1/query_range` with log queries: streams of `[<ns epoch STRING>, <line>]`, `limit`
(default 100; above `max_entries_limit` a 400), `direction` backward (default) or forward, `start` inclusive and
`end` exclusive, Loki's timestamp rules (`.` -> float seconds, <= 10 digits -> seconds, longer -> ns, else
RFC3339), `X-Scope-OrgID` (401 `no org id` when auth is enabled), plain-text error bodies (optionally with the
JSON Content-Type Loki 2.6 sends), `/loki/api/v1/query` refusing log queries. LogQL: a stream selector with
`=`, `!=`, `=~`, `!~` (anchored RE2-ish regexes) followed by line filters `|=`, `!=`, `|~`, `!~`.

Failure modes for tests: `down()` (connection refused), `delay` (slow), `hold_queries_with` (one query that gets
no answer while others do), `fail(status, body, times)` (500,
429, 504...), `malformed()` (200 with a body that is not a query result), `oversized(size)` (a 200 query
result of `size` bytes, or an endless one, optionally gzip-compressed). Every request is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aiohttp import web

from tests.fakes.server import LoopbackServer

TEXT_PLAIN = "text/plain; charset=utf-8"
# Loki 2.6.1 sent plain-text error bodies with this Content-Type (protocols.md 4.2).
LOKI_26_ERROR_CONTENT_TYPE = "application/json; charset=UTF-8"
DEFAULT_LIMIT = 100
MAX_ENTRIES_LIMIT = 5000

_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_STRING = r'"(?:[^"\\\n]|\\.)*"|`[^`]*`'  # like Go: no raw newline in a "..." string
_MATCHER = re.compile(rf"\s*({_NAME})\s*(=~|!~|!=|=)\s*({_STRING})\s*")
_FILTER = re.compile(rf"\s*(\|=|!=|\|~|!~)\s*({_STRING})\s*")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "'": "'", "`": "`"}


class LogQLError(ValueError):
    pass


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found

    @property
    def empty_compatible(self) -> bool:
        return self.matches({})


@dataclass(frozen=True)
class LineFilter:
    op: str
    value: str

    def matches(self, line: str) -> bool:
        if self.op == "|=":
            return self.value in line
        if self.op == "!=":
            return self.value not in line
        found = re.search(self.value, line) is not None  # line-filter regexes are not anchored
        return found if self.op == "|~" else not found


@dataclass(frozen=True)
class LogQuery:
    matchers: tuple[Matcher, ...]
    filters: tuple[LineFilter, ...]

    def selects(self, labels: dict[str, str]) -> bool:
        return all(m.matches(labels) for m in self.matchers)

    def keeps(self, line: str) -> bool:
        return all(f.matches(line) for f in self.filters)


def unquote(token: str) -> str:
    if token.startswith("`"):
        return token[1:-1]
    body = token[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        if body[i] == "\\":
            nxt = body[i + 1]
            if nxt == "x":
                out.append(chr(int(body[i + 2 : i + 4], 16)))
                i += 4
                continue
            if nxt not in _ESCAPES:
                raise LogQLError(f"invalid escape \\{nxt}")
            out.append(_ESCAPES[nxt])
            i += 2
            continue
        out.append(body[i])
        i += 1
    return "".join(out)


def parse_logql(text: str) -> LogQuery:
    """The small LogQL subset the bot sends: `{a="b", c=~"d"} |= "x" |~ "y"`."""
    text = text.strip()
    if not text.startswith("{"):
        raise LogQLError(f"parse error at line 1, col 1: syntax error: unexpected {text[:1] or '$end'}")
    position = 1
    matchers: list[Matcher] = []
    while True:
        match = _MATCHER.match(text, position)
        if match is None:
            raise LogQLError(f"parse error at line 1, col {position + 1}: syntax error: unexpected input")
        name, op, value = match.group(1), match.group(2), unquote(match.group(3))
        if op in ("=~", "!~"):
            _check_regex(value, position)
        matchers.append(Matcher(name, op, value))
        position = match.end()
        if text.startswith(",", position):
            position += 1
            continue
        if text.startswith("}", position):
            position += 1
            break
        raise LogQLError(
            f"parse error at line 1, col {position + 1}: syntax error: unexpected input, expecting , or }}"
        )
    filters: list[LineFilter] = []
    while position < len(text):
        match = _FILTER.match(text, position)
        if match is None:
            if not text[position:].strip():
                break
            raise LogQLError(f"parse error at line 1, col {position + 1}: syntax error: unexpected input")
        op, value = match.group(1), unquote(match.group(2))
        if op in ("|~", "!~"):
            _check_regex(value, position)
        filters.append(LineFilter(op, value))
        position = match.end()
    if all(m.empty_compatible for m in matchers):
        raise LogQLError(
            "queries require at least one regexp or equality matcher that does not have an empty-compatible value. "
            'For instance, app=~".*" does not meet this requirement, but app=~".+" will'
        )
    return LogQuery(tuple(matchers), tuple(filters))


def _check_regex(pattern: str, position: int) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise LogQLError(f"parse error at line 1, col {position + 1}: invalid regex: {exc}") from None


def parse_timestamp(value: str, default_ns: int) -> int:
    """Loki's parseTimestamp: `.` -> float seconds (ms precision), <= 10 digits seconds, more ns, else RFC3339."""
    if not value:
        return default_ns
    if "." in value:
        try:
            seconds = float(value)
        except ValueError:
            pass
        else:
            whole = math.floor(seconds)
            return whole * 1_000_000_000 + round((seconds - whole) * 1000) * 1_000_000
    try:
        number = int(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f'cannot parse "{value}" to a valid timestamp') from None
        return to_ns(moment)
    return number * 1_000_000_000 if len(value.lstrip("-")) <= 10 else number


def to_ns(moment: datetime | int | float) -> int:
    if isinstance(moment, datetime):
        return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000
    if isinstance(moment, float):
        return round(moment * 1_000_000_000)
    return moment


@dataclass
class Entry:
    ns: int
    line: str
    labels: dict[str, str]
    tenant: str


@dataclass
class RecordedQuery:
    path: str
    method: str
    params: dict[str, str]
    org_id: str | None
    authorization: str | None

    @property
    def query(self) -> str:
        return self.params.get("query", "")


@dataclass
class _Failure:
    status: int
    body: str
    content_type: str
    headers: dict[str, str]
    times: int | None


@dataclass
class FakeLoki(LoopbackServer):
    """Start with `async with FakeLoki() as loki:`; push lines with `loki.push(labels, line, at)`."""

    auth_enabled: bool = False
    max_entries_limit: int = MAX_ENTRIES_LIMIT
    error_content_type: str = TEXT_PLAIN
    delay: float = 0.0
    # Queries whose LogQL contains this text get no answer until stop(): one slow query among others.
    hold_queries_with: str = ""
    requests: list[RecordedQuery] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    _failures: list[_Failure] = field(default_factory=list)
    _malformed: bool = False
    _oversized: tuple[int | None, bool] | None = None
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    # --- lifecycle ---
    def routes(self, app: web.Application) -> None:
        for path in ("/loki/api/v1/query_range", "/loki/api/v1/query"):
            app.router.add_route("GET", path, self._handle)
            app.router.add_route("POST", path, self._handle)
        app.router.add_get("/ready", self._ready)

    async def stop(self) -> None:
        self._released.set()
        await super().stop()

    @property
    def url(self) -> str:
        return self.base_url

    # --- data and behaviour ---
    def push(self, labels: dict[str, str], line: str, at: datetime | int | float, tenant: str = "fake") -> None:
        """One log line: `at` is a datetime, float seconds or int nanoseconds."""
        self.entries.append(Entry(to_ns(at), line, dict(labels), tenant))

    def fail(
        self,
        status: int = 500,
        body: str | None = None,
        *,
        times: int | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Answer the next `times` queries (all of them if None) with this error."""
        text = body if body is not None else _DEFAULT_ERRORS.get(status, "internal server error")
        self._failures.append(_Failure(status, text, content_type or self.error_content_type, headers or {}, times))

    def malformed(self, on: bool = True) -> None:
        self._malformed = on

    def oversized(self, size: int | None, *, compressed: bool = False) -> None:
        """Answer every query with a well-formed start of a result whose one line runs to `size` bytes (None:
        forever, until the client hangs up); `compressed` sends it gzip-encoded (a few kB on the wire)."""
        self._oversized = (size, compressed)

    def heal(self) -> None:
        self._failures.clear()
        self._malformed = False
        self._oversized = None
        self.delay = 0.0

    @property
    def range_queries(self) -> list[RecordedQuery]:
        return [r for r in self.requests if r.path.endswith("/query_range")]

    # --- handlers ---
    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(text="ready\n")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if request.method == "POST":
            params.update({k: str(v) for k, v in (await request.post()).items()})
        org_id = request.headers.get("X-Scope-OrgID")
        self.requests.append(
            RecordedQuery(request.path, request.method, params, org_id, request.headers.get("Authorization"))
        )
        if self.hold_queries_with and self.hold_queries_with in params.get("query", ""):
            await self._released.wait()
        if self.delay:
            # A slow Loki; stop() releases waiting requests so shutting the fake down stays quick.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), self.delay)
        failure = self._next_failure()
        if failure is not None:
            return web.Response(
                status=failure.status,
                body=failure.body.encode(),
                headers={"Content-Type": failure.content_type, **failure.headers},
            )
        if self.auth_enabled and not org_id:
            return self._error(401, "no org id")
        if self._malformed:
            return web.Response(status=200, body=b"<html>upstream connect error</html>", content_type="text/html")
        if self._oversized is not None:
            return await self._oversized_answer(request, *self._oversized)
        try:
            query = parse_logql(params.get("query", ""))
        except LogQLError as exc:
            return self._error(400, str(exc))
        if request.path.endswith("/query"):
            return self._error(
                400,
                "log queries are not supported as an instant query type, "
                "please change your query to a range query type",
            )
        return self._query_range(query, params, org_id or "fake")

    def _query_range(self, query: LogQuery, params: dict[str, str], tenant: str) -> web.Response:
        try:
            limit = int(params.get("limit") or DEFAULT_LIMIT)
            end = parse_timestamp(params.get("end", ""), to_ns(datetime.now().astimezone()))
            start = parse_timestamp(params.get("start", ""), end - 3600 * 1_000_000_000)
        except ValueError as exc:
            return self._error(400, str(exc))
        direction = params.get("direction", "backward")
        if direction not in ("backward", "forward"):
            return self._error(400, f"invalid direction '{direction}'")
        if limit <= 0:
            return self._error(400, "limit must be a positive value")
        if limit > self.max_entries_limit:
            return self._error(
                400,
                f"max entries limit per query exceeded, limit > max_entries_limit_per_query "
                f"({limit} > {self.max_entries_limit})",
            )
        if end <= start:
            return self._error(400, "end timestamp must not be before or equal to start time")
        selected = [
            e
            for e in self.entries
            if e.tenant == tenant and start <= e.ns < end and query.selects(e.labels) and query.keeps(e.line)
        ]
        selected.sort(key=lambda e: e.ns)
        if direction == "backward":
            # Loki reads a chunk forward and reverses it: lines with the same timestamp come out reversed too.
            selected.reverse()
        selected = selected[:limit]
        streams: dict[tuple[tuple[str, str], ...], list[list[str]]] = {}
        for entry in selected:
            streams.setdefault(tuple(sorted(entry.labels.items())), []).append([str(entry.ns), entry.line])
        body: dict[str, Any] = {
            "status": "success",
            "data": {
                "resultType": "streams",
                "result": [{"stream": dict(key), "values": values} for key, values in streams.items()],
                "stats": {"summary": {"execTime": 0.001, "totalLinesProcessed": len(selected)}},
            },
        }
        return web.json_response(body)

    async def _oversized_answer(self, request: web.Request, size: int | None, compressed: bool) -> web.StreamResponse:
        start = b'{"status":"success","data":{"resultType":"streams","result":[{"stream":{},"values":[["1","'
        end = b'"]]}]}}'
        if compressed:
            assert size is not None, "an endless answer is sent uncompressed"
            bomb = gzip.compress(start + b"x" * size + end)
            return web.Response(body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        chunk = b"x" * 65536
        written = 0
        with contextlib.suppress(ConnectionError):
            await response.write(start)
            while size is None or written < size:
                await response.write(chunk)
                written += len(chunk)
            await response.write(end)
        return response

    def _next_failure(self) -> _Failure | None:
        if not self._failures:
            return None
        failure = self._failures[0]
        if failure.times is not None:
            failure.times -= 1
            if failure.times <= 0:
                self._failures.pop(0)
        return failure

    def _error(self, status: int, text: str) -> web.Response:
        return web.Response(
            status=status, body=(text + "\n").encode(), headers={"Content-Type": self.error_content_type}
        )


_DEFAULT_ERRORS = {
    429: "too many outstanding requests",
    500: "rpc error: code = Internal desc = failed to get ingester clients",
    502: "bad gateway",
    503: "rpc error: code = Unavailable desc = connection refused",
    504: "request timed out, decrease the duration of the request or add more label matchers, "
    "or increase the timeout, or upgrade to use Loki's query sharding",
}

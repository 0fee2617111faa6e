"""Loki: the fake speaks the documented query_range API; the client and the `loki` enricher against it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.config import LokiConfig
from bot.enrich.base import EnrichmentRequest
from bot.enrich.loki import LokiClient, LokiEnricher, to_ns
from bot.enrich.queryapi import Deadline, QueryError
from bot.evidence import EnrichmentSection
from bot.models import AlertState
from bot.querytemplate import TemplateError, fill_query, quoted, regex_literal
from tests.fakes.loki import LOKI_26_ERROR_CONTENT_TYPE, TEXT_PLAIN, FakeLoki, parse_logql, parse_timestamp, unquote
from tests.support.bot import eventually
from tests.support.payloads import alert_state

# Alerts started an hour ago: answers fetched now may be shared by them (they were asked after the start).
T = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0)
FIXED = datetime(2026, 11, 29, 13, 30, 0, tzinfo=UTC)
XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python3, GPU has fallen off the bus."
SYSLOG = {"job": "syslog", "host": "k-ai-01"}
NS = 1_000_000_000


@pytest.fixture
async def loki() -> AsyncIterator[FakeLoki]:
    async with FakeLoki() as fake:
        yield fake


def make_alert(labels: dict[str, str] | None = None, starts_at: datetime = T) -> AlertState:
    labels = {"alertname": "GPUXidError", "Hostname": "k-ai-01", "gpu": "2", **(labels or {})}
    return alert_state(labels, starts_at=starts_at, key=f"{labels}@{starts_at}")


def config(loki: FakeLoki, **options: Any) -> LokiConfig:
    return LokiConfig.model_validate({"url": loki.url, **options})


async def enrich(enricher: LokiEnricher, alert: AlertState) -> EnrichmentSection:
    return await enricher.enrich(EnrichmentRequest(alert, None, {}))


async def get_raw(loki: FakeLoki, path: str = "/loki/api/v1/query_range", **params: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=loki.url) as client:
        return await client.get(path, params=params)


# --- the fake speaks Loki's documented API ------------------------------------------------------------
async def test_fake_returns_streams_of_nanosecond_string_timestamps_newest_first(loki: FakeLoki) -> None:
    for i in range(150):
        loki.push({**SYSLOG, "n": str(i % 2)}, f"NVRM: line {i}", T + timedelta(seconds=i))
    response = await get_raw(
        loki, query='{job="syslog"} |= "NVRM:"', start=str(to_ns(T)), end=str(to_ns(T) + 3600 * NS)
    )
    body = response.json()
    assert body["status"] == "success" and body["data"]["resultType"] == "streams"
    streams = body["data"]["result"]
    assert len(streams) == 2
    values = [v for s in streams for v in s["values"]]
    assert len(values) == 100  # Loki's default limit
    assert all(isinstance(ts, str) and len(ts) == 19 for ts, _ in values)
    newest_first = [int(ts) for ts, _ in streams[0]["values"]]
    assert newest_first == sorted(newest_first, reverse=True)
    assert max(int(ts) for ts, _ in values) == to_ns(T + timedelta(seconds=149))


async def test_fake_limit_above_the_maximum_is_a_plain_text_400(loki: FakeLoki) -> None:
    response = await get_raw(loki, query='{job="syslog"}', limit="5001")
    assert response.status_code == 400
    assert response.headers["Content-Type"].startswith("text/plain")
    assert response.text.startswith("max entries limit per query exceeded, limit > max_entries_limit_per_query")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1795959386", 1795959386 * NS),  # <= 10 digits: seconds
        ("1795959386000000000", 1795959386 * NS),  # longer: nanoseconds
        ("1795959386.25", 1795959386 * NS + 250_000_000),  # a dot: float seconds
        ("2026-11-29T13:30:00Z", to_ns(FIXED)),
        ("2026-11-29T13:30:00.5+00:00", to_ns(FIXED) + NS // 2),
    ],
)
def test_fake_parses_timestamps_like_loki(text: str, expected: int) -> None:
    assert parse_timestamp(text, 0) == expected


async def test_fake_start_is_inclusive_and_end_exclusive(loki: FakeLoki) -> None:
    for offset in (0, 1, 2):
        loki.push(SYSLOG, f"NVRM: at +{offset}", T + timedelta(seconds=offset))
    response = await get_raw(loki, query='{job="syslog"}', start=str(to_ns(T)), end=str(to_ns(T) + 2 * NS))
    lines = sorted(v[1] for s in response.json()["data"]["result"] for v in s["values"])
    assert lines == ["NVRM: at +0", "NVRM: at +1"]


async def test_fake_needs_an_org_id_when_auth_is_enabled() -> None:
    async with FakeLoki(auth_enabled=True) as loki:
        response = await get_raw(loki, query='{job="syslog"}')
    assert response.status_code == 401
    assert response.text.strip() == "no org id"


async def test_fake_refuses_log_queries_on_the_instant_endpoint_and_empty_compatible_selectors(loki: FakeLoki) -> None:
    instant = await get_raw(loki, "/loki/api/v1/query", query='{job="syslog"}')
    assert instant.status_code == 400 and "not supported as an instant query" in instant.text
    empty = await get_raw(loki, query='{job=~".*"}')
    assert empty.status_code == 400 and "empty-compatible value" in empty.text
    broken = await get_raw(loki, query='{job="syslog"')
    assert broken.status_code == 400 and broken.text.startswith("parse error")


# --- the client ---------------------------------------------------------------------------------------
async def test_client_merges_streams_oldest_first_and_sends_nanosecond_strings(loki: FakeLoki) -> None:
    for i in range(9):
        loki.push({**SYSLOG, "stream": str(i % 3)}, f"NVRM: {i}", T + timedelta(milliseconds=100 * i))
    client = LokiClient(config(loki))
    try:
        result = await client.query_range(
            '{job="syslog"}', to_ns(T), to_ns(T) + 60 * NS, limit=100, deadline=Deadline(2)
        )
    finally:
        await client.close()
    assert [line for _, line in result.entries] == [f"NVRM: {i}" for i in range(9)]
    assert result.entries[1][0] == to_ns(T) + 100_000_000
    assert not result.truncated
    sent = loki.range_queries[0].params
    assert sent["start"] == str(to_ns(T)) and len(sent["end"]) == 19
    assert sent["direction"] == "backward" and sent["limit"] == "100"


async def test_client_keeps_the_newest_lines_and_flags_truncation_at_the_limit(loki: FakeLoki) -> None:
    for i in range(8):
        loki.push({**SYSLOG, "stream": str(i % 2)}, f"NVRM: {i}", T + timedelta(seconds=i))
    client = LokiClient(config(loki))
    try:
        result = await client.query_range('{job="syslog"}', to_ns(T), to_ns(T) + 60 * NS, limit=5, deadline=Deadline(2))
    finally:
        await client.close()
    assert [line for _, line in result.entries] == [f"NVRM: {i}" for i in range(3, 8)]
    assert result.truncated


@pytest.mark.parametrize("content_type", [TEXT_PLAIN, LOKI_26_ERROR_CONTENT_TYPE])
async def test_error_bodies_are_read_as_text_whatever_the_content_type(content_type: str) -> None:
    async with FakeLoki(max_entries_limit=500, error_content_type=content_type) as loki:
        client = LokiClient(config(loki, limit=1000))
        try:
            with pytest.raises(QueryError) as caught:
                await client.query_range('{job="syslog"}', to_ns(T), to_ns(T) + NS, limit=1000, deadline=Deadline(2))
        finally:
            await client.close()
        assert len(loki.requests) == 1  # a 400 is not retried
    assert caught.value.reason == "http_400"
    assert "max entries limit per query exceeded" in caught.value.detail
    assert "(1000 > 500)" in caught.value.detail


async def test_tenant_and_bearer_token_are_sent(tmp_path: Path) -> None:
    token = tmp_path / "loki_token"
    token.write_text("s3cret-token\n")
    async with FakeLoki(auth_enabled=True) as loki:
        loki.push(SYSLOG, XID, T, tenant="team-a")
        loki.push(SYSLOG, "NVRM: another tenant's line", T, tenant="team-b")
        enricher = LokiEnricher(config(loki, tenant_id="team-a", bearer_token_file=str(token)), timeout=2)
        try:
            section = await enrich(enricher, make_alert())
        finally:
            await enricher.close()
        sent = loki.range_queries[0]
    assert sent.org_id == "team-a"
    assert sent.authorization == "Bearer s3cret-token"
    assert [line for _, line in section.data.entries] == [XID]


async def test_missing_tenant_is_reported_with_lokis_words() -> None:
    async with FakeLoki(auth_enabled=True) as loki:
        enricher = LokiEnricher(config(loki), timeout=2)
        try:
            section = await enrich(enricher, make_alert())
        finally:
            await enricher.close()
    assert section.status == "unavailable"
    assert section.reason == "Loki answered HTTP 401: no org id"


@pytest.mark.parametrize("status", [500, 502, 503, 429])
async def test_server_errors_and_throttling_are_retried(loki: FakeLoki, status: int) -> None:
    loki.push(SYSLOG, XID, T)
    loki.fail(status, times=1, headers={"Retry-After": "0"} if status == 429 else None)
    enricher = LokiEnricher(config(loki), timeout=2)
    try:
        section = await enrich(enricher, make_alert())
    finally:
        await enricher.close()
    assert section.status == "ok"
    assert len(loki.range_queries) == 2


async def test_a_slow_loki_costs_no_more_than_the_deadline(loki: FakeLoki) -> None:
    loki.delay = 30
    enricher = LokiEnricher(config(loki), timeout=0.3)
    try:
        section = await enrich(enricher, make_alert())
    finally:
        await enricher.close()
    assert section.status == "unavailable"
    assert section.reason == "no answer from Loki within 0.3 s"


async def test_a_loki_that_is_down_is_reported(loki: FakeLoki) -> None:
    await loki.go_down()
    enricher = LokiEnricher(config(loki), timeout=0.5)
    try:
        section = await enrich(enricher, make_alert())
    finally:
        await enricher.close()
    assert section.status == "unavailable"
    assert section.reason.startswith(f"cannot reach Loki at {loki.url}: ")


async def test_an_answer_that_is_not_a_query_result_is_reported(loki: FakeLoki) -> None:
    loki.malformed()
    enricher = LokiEnricher(config(loki), timeout=1)
    try:
        section = await enrich(enricher, make_alert())
    finally:
        await enricher.close()
    assert section.status == "unavailable"
    assert section.reason.startswith("Loki answered something that is not a log query result: <html>")


# --- the enricher -------------------------------------------------------------------------------------
async def test_section_holds_the_hosts_nvrm_lines_of_the_window(loki: FakeLoki) -> None:
    at = {
        "before the window": T - timedelta(minutes=15, seconds=1),
        "window start": T - timedelta(minutes=15),
        "just before": T - timedelta(seconds=30),
        "just after": T + timedelta(minutes=1, seconds=59),
        "window end": T + timedelta(minutes=2),
    }
    for name, moment in at.items():
        loki.push(SYSLOG, f"NVRM: {name}", moment)
    loki.push(SYSLOG, "systemd[1]: Started session 4.", T)
    loki.push({"job": "syslog", "host": "k-ai-02"}, "NVRM: another host", T)
    enricher = LokiEnricher(config(loki), timeout=2)
    try:
        section = await enrich(enricher, make_alert())
    finally:
        await enricher.close()
    assert section.status == "ok" and section.name == "loki" and section.title == "Kernel log (Loki)"
    data = section.data.model_dump(mode="json")  # the JSON the store keeps
    assert data["host"] == "k-ai-01"
    assert data["query"] == '{job="syslog", host="k-ai-01"} |= "NVRM:"'
    assert data["start"] == (T - timedelta(minutes=15)).isoformat()
    assert data["end"] == (T + timedelta(minutes=2)).isoformat()
    assert data["entries"] == [
        [at[name].isoformat(), f"NVRM: {name}"] for name in ("window start", "just before", "just after")
    ]
    assert data["truncated"] is False
    assert data["render"] == "code"
    span = f"{T - timedelta(minutes=15):%H:%M}-{T + timedelta(minutes=2):%H:%M} UTC"
    assert section.summary == f'3 lines matching "NVRM:" for k-ai-01, {span}'
    assert section.lines == [
        f"{at[name]:%H:%M:%S}.000 NVRM: {name}" for name in ("window start", "just before", "just after")
    ]


@pytest.mark.parametrize(
    "hostile",
    ['k-ai-01"} |= "x', 'k-ai-01", job=~".+', "back\\slash", "new\nline", "k-ai-01.*", "{host}", "ünï`cödé'"],
)
async def test_hostile_host_values_are_data_not_logql(loki: FakeLoki, hostile: str) -> None:
    loki.push({"job": "syslog", "host": hostile}, "NVRM: for the hostile host", T)
    loki.push(SYSLOG, "NVRM: for k-ai-01, must not leak", T)
    enricher = LokiEnricher(config(loki), timeout=2)
    try:
        section = await enrich(enricher, make_alert({"Hostname": hostile}))
    finally:
        await enricher.close()
    assert section.status == "ok", section.reason
    assert [line for _, line in section.data.entries] == ["NVRM: for the hostile host"]
    parsed = parse_logql(loki.range_queries[0].query)
    assert [(m.name, m.op, m.value) for m in parsed.matchers] == [("job", "=", "syslog"), ("host", "=", hostile)]


async def test_regex_selectors_match_the_host_literally(loki: FakeLoki) -> None:
    loki.push({"job": "syslog", "host": "k.ai.lan"}, "NVRM: fqdn", T)
    loki.push({"job": "syslog", "host": "kxai"}, "NVRM: would match an unescaped k.ai", T)
    selector = '{job="syslog", host=~"{host}(\\\\..+)?"}'
    enricher = LokiEnricher(config(loki, selector=selector), timeout=2)
    try:
        section = await enrich(enricher, make_alert({"Hostname": "k.ai"}))
    finally:
        await enricher.close()
    assert [line for _, line in section.data.entries] == ["NVRM: fqdn"]
    assert section.data.query == '{job="syslog", host=~"k\\\\.ai(\\\\..+)?"} |= "NVRM:"'


async def test_instance_loses_its_port_and_host_map_translates_it(loki: FakeLoki) -> None:
    loki.push({"job": "syslog", "nodename": "k-ai-01"}, XID, T)
    options = {"selector": '{job="syslog", nodename="{host}"}', "host_map": {"10.0.0.11": "k-ai-01"}}
    enricher = LokiEnricher(config(loki, **options), timeout=2)
    try:
        section = await enrich(enricher, make_alert({"Hostname": "", "instance": "10.0.0.11:9400"}))
    finally:
        await enricher.close()
    assert section.data.host == "k-ai-01"
    assert [line for _, line in section.data.entries] == [XID]


async def test_an_alert_without_a_host_is_skipped(loki: FakeLoki) -> None:
    enricher = LokiEnricher(config(loki), timeout=2)
    try:
        section = await enrich(enricher, make_alert({"Hostname": ""}))
    finally:
        await enricher.close()
    assert section.status == "skipped"
    assert "Hostname" in section.reason
    assert loki.requests == []


async def test_truncation_and_the_number_of_lines_shown(loki: FakeLoki) -> None:
    for i in range(30):
        loki.push(SYSLOG, f"NVRM: {i:02d}", T - timedelta(minutes=10) + timedelta(seconds=i))
    enricher = LokiEnricher(config(loki, limit=25, show_lines=4), timeout=2)
    try:
        section = await enrich(enricher, make_alert())
    finally:
        await enricher.close()
    assert section.data.truncated is True
    assert [line for _, line in section.data.entries] == [f"NVRM: {i:02d}" for i in range(5, 30)]
    assert [line.split(" ", 1)[1] for line in section.lines] == ["NVRM: 26", "NVRM: 27", "NVRM: 28", "NVRM: 29"]
    assert "truncated: Loki's limit of 25 reached, newest kept" in section.summary
    assert section.summary.endswith("; last 4 shown")


async def test_alerts_of_one_incident_share_one_query_per_host(loki: FakeLoki) -> None:
    for host in ("k-ai-01", "k-ai-02"):
        loki.push({"job": "syslog", "host": host}, f"NVRM: Xid on {host}", T)
    enricher = LokiEnricher(config(loki), timeout=2)
    alerts = [
        make_alert({"Hostname": host, "gpu": str(gpu)}, starts_at=T + timedelta(seconds=7 * gpu - 25))
        for host in ("k-ai-01", "k-ai-02")
        for gpu in range(8)
    ]
    try:
        sections = await asyncio.gather(*(enrich(enricher, a) for a in alerts))
        again = await enrich(enricher, alerts[3])  # answered from the short cache
    finally:
        await enricher.close()
    assert len(loki.range_queries) == 2
    assert sorted(q.query for q in loki.range_queries) == [
        '{job="syslog", host="k-ai-01"} |= "NVRM:"',
        '{job="syslog", host="k-ai-02"} |= "NVRM:"',
    ]
    for alert, section in zip(alerts, sections, strict=True):
        assert [line for _, line in section.data.entries] == [f"NVRM: Xid on {alert.labels['Hostname']}"]
        assert section.data.start == (alert.starts_at - timedelta(minutes=15)).isoformat()
    assert again.data == sections[3].data


async def test_an_answer_is_not_reused_for_an_alert_that_started_after_it_was_asked(loki: FakeLoki) -> None:
    enricher = LokiEnricher(config(loki), timeout=2)
    now = datetime.now(UTC)
    try:
        await enrich(enricher, make_alert(starts_at=now - timedelta(seconds=5)))
        # The first query's round trip lies between when it was asked and the later alert's start.
        loki.push(SYSLOG, XID, datetime.now(UTC))
        later = await enrich(enricher, make_alert(starts_at=datetime.now(UTC)))
    finally:
        await enricher.close()
    assert len(loki.range_queries) == 2
    assert [line for _, line in later.data.entries] == [XID]


async def test_a_failed_query_is_shared_by_the_alerts_waiting_for_it(loki: FakeLoki) -> None:
    loki.fail(400, "parse error at line 1, col 19: syntax error: unexpected $end")
    enricher = LokiEnricher(config(loki), timeout=2)
    try:
        sections = await asyncio.gather(*(enrich(enricher, make_alert({"gpu": str(g)})) for g in range(6)))
    finally:
        await enricher.close()
    assert len(loki.requests) == 1
    assert {s.reason for s in sections} == {
        "Loki answered HTTP 400: parse error at line 1, col 19: syntax error: unexpected $end"
    }


# --- query text ---------------------------------------------------------------------------------------
@given(st.text())
def test_any_host_value_round_trips_through_a_logql_string(value: str) -> None:
    query = fill_query('{job="syslog", host="{host}"}', {"host": value}) if value else quoted("")
    if value:
        assert parse_logql(query).matchers[1].value == value
    assert unquote(quoted(value)) == value


@given(st.text())
def test_any_value_is_matched_literally_by_its_regex(value: str) -> None:
    assert re.fullmatch(regex_literal(value), value) is not None


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("{job=syslog, host={host}}", "placeholder {host} is not inside a double-quoted string"),
        ("{job=`syslog`, host=`{host}`}", "placeholder {host} is not inside a double-quoted string"),
        ('{job="syslog", pod="{pod}"}', "the alert has no label pod"),
        ('{job="syslog, host="{host}"}', "unterminated string"),
    ],
)
def test_templates_that_cannot_be_filled_safely_are_refused(template: str, problem: str) -> None:
    with pytest.raises(TemplateError, match=re.escape(problem)):
        fill_query(template, {"host": "k-ai-01"})


def test_the_selector_must_hold_the_host_inside_a_quoted_value() -> None:
    with pytest.raises(ValueError, match="inside a double-quoted value"):
        LokiConfig(url="http://loki:3100", selector='{job="syslog", host={host}}')
    with pytest.raises(ValueError, match="inside a double-quoted value"):
        LokiConfig(url="http://loki:3100", selector='{job="syslog"}')
    assert LokiConfig(url="http://loki:3100", selector='{job="syslog", nodename=~"{host}.*"}')


async def test_a_retry_after_beyond_the_deadline_is_not_waited_for() -> None:
    async with FakeLoki() as loki:
        loki.fail(429, times=1, headers={"Retry-After": "30"})
        enricher = LokiEnricher(config(loki), timeout=2)
        try:
            section = await asyncio.wait_for(enrich(enricher, make_alert()), timeout=10)
        finally:
            await enricher.close()
        assert section.status == "unavailable" and "HTTP 429" in section.reason
        assert len(loki.range_queries) == 1  # Loki asked for 30 s; the deadline is 2 s: no retry


async def test_one_alert_giving_up_does_not_cancel_the_query_it_shares() -> None:
    async with FakeLoki() as loki:
        loki.push(SYSLOG, XID, T)
        loki.delay = 0.5
        enricher = LokiEnricher(config(loki), timeout=5)
        try:
            impatient = asyncio.create_task(enrich(enricher, make_alert({"gpu": "1"})))
            patient = asyncio.create_task(enrich(enricher, make_alert({"gpu": "2"})))
            await eventually(lambda: loki.range_queries)  # the one query both wait for is at Loki
            impatient.cancel()  # its enrichment budget ran out
            section = await patient
        finally:
            await enricher.close()
        assert section.status == "ok" and [line for _, line in section.data.entries] == [XID]

"""The Prometheus enricher's parts: generatorURL decoding, the value behind a rule's comparison, series
matching, sparklines and NaN, PromQL escaping, the rules fallback, and the API's error shapes."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.config import PrometheusConfig
from bot.enrich.base import EnrichmentRequest
from bot.enrich.prometheus import (
    TARGET_POINTS,
    PrometheusClient,
    PrometheusEnricher,
    RawSeries,
    best_series,
    choose_step,
    describe,
    expression_from_generator_url,
    format_value,
    gpu_inventory,
    series_summary,
    sparkline,
    value_expression,
    value_meaning,
)
from bot.enrich.queryapi import Deadline, QueryError
from bot.evidence import EnrichmentSection
from bot.models import AlertState
from bot.playbooks import Playbook
from bot.querytemplate import fill_query
from tests.support.exporter import dcgm_labels
from tests.support.payloads import alert_state

PROMETHEUS = "http://prometheus.test:9090"
# From a real Prometheus 2.42 -> Alertmanager 0.25 capture (protocols.md 3.3).
CAPTURED_URL = (
    "http://prom.example:9090/prom/graph?g0.expr=sum+by+%28instance%2C+job%29+%28up%7Bjob%3D%22prom%22%7D%29"
    "+%3E+0&g0.tab=1"
)
SEED_RULES = {
    "DCGM_FI_DEV_GPU_TEMP > 87": ("DCGM_FI_DEV_GPU_TEMP", "> 87"),
    "rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) > 0": ("rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m])", "> 0"),
    "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0": ("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])", "> 0"),
    "increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0": ("increase(DCGM_FI_DEV_XID_ERRORS[5m])", "> 0"),
    "DCGM_FI_DEV_POWER_USAGE > 590": ("DCGM_FI_DEV_POWER_USAGE", "> 590"),
    "DCGM_FI_DEV_GPU_UTIL < 5 and DCGM_FI_DEV_FB_USED > 1024": ("DCGM_FI_DEV_GPU_UTIL", "< 5"),
    "(node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes) < 0.05": (
        "(node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes)",
        "< 0.05",
    ),
    "increase(node_vmstat_oom_kill[5m]) > 0": ("increase(node_vmstat_oom_kill[5m])", "> 0"),
    "rate(container_start_time_seconds[15m]) > 3": ("rate(container_start_time_seconds[15m])", "> 3"),
    "vllm:num_requests_waiting > 10": ("vllm:num_requests_waiting", "> 10"),
    "histogram_quantile(0.95, rate(vllm:e2e_request_latency_seconds_bucket[5m])) > 10": (
        "histogram_quantile(0.95, rate(vllm:e2e_request_latency_seconds_bucket[5m]))",
        "> 10",
    ),
}


# --- generatorURL -------------------------------------------------------------------------------------
def test_generator_url_is_decoded_with_parse_qs_so_plus_is_a_space() -> None:
    assert expression_from_generator_url(CAPTURED_URL) == 'sum by (instance, job) (up{job="prom"}) > 0'
    assert urllib.parse.unquote(CAPTURED_URL).count("+") > 0  # what a naive decoder would leave


@pytest.mark.parametrize(
    "url",
    [
        "",
        "http://grafana:3000/explore?left=%7B%22queries%22%3A%5B%7B%22expr%22%3A%22%7Bjob%3D%5C%22x%5C%22%7D%22%7D%5D%7D",
        "http://prom.example:9090/graph?g0.tab=1",
        "http://thanos.example/alerts?id=3",
        "not a url at all",
    ],
)
def test_links_that_are_not_prometheus_graph_links_give_no_expression(url: str) -> None:
    assert expression_from_generator_url(url) is None


@given(st.text().filter(lambda t: t.strip() == t and t))
def test_any_expression_survives_gos_query_escape(expr: str) -> None:
    url = f"http://prom:9090/graph?g0.expr={urllib.parse.quote_plus(expr)}&g0.tab=1"
    assert expression_from_generator_url(url) == expr


@given(st.text())
def test_random_links_never_raise(url: str) -> None:
    expression_from_generator_url(url)


# --- the value behind the comparison ------------------------------------------------------------------
@pytest.mark.parametrize(("expr", "expected"), SEED_RULES.items())
def test_seed_rules_graph_their_value_not_the_filtered_samples(expr: str, expected: tuple[str, str]) -> None:
    graphed = value_expression(expr)
    assert (graphed.query, graphed.comparison) == expected


@pytest.mark.parametrize(
    ("expr", "query", "comparison"),
    [
        ("87 < DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP", "> 87"),
        ('up{job=">"} == 0', 'up{job=">"}', "== 0"),
        ('x{a="}"} >= 1', 'x{a="}"}', ">= 1"),
        ("a > bool 3", "a > bool 3", None),
        ("a > 1 or b > 2", "a or b", None),
        ("a > 1 or b > 1 or a > 1", "a or b", "> 1"),
        ("(a > 1) or b", "(a > 1) or b", None),
        ("((x > 1))", "x", "> 1"),
        ("(a) + (b) > 1", "(a) + (b)", "> 1"),
        ("a > 1 unless b", "a", "> 1"),
        ("a > on(instance) group_left b", "a", "> on(instance) group_left b"),
        ("sum(rate(x[5m]))", "sum(rate(x[5m]))", None),
        ('absent(up{job="dcgm"})', 'absent(up{job="dcgm"})', None),
        ("orphan_metric > 2", "orphan_metric", "> 2"),
        ("(a > 1", "(a > 1", None),
    ],
)
def test_comparisons_are_found_outside_brackets_and_strings(expr: str, query: str, comparison: str | None) -> None:
    graphed = value_expression(expr)
    assert (graphed.query, graphed.comparison) == (query, comparison)


@given(st.text())
def test_value_expression_never_raises(expr: str) -> None:
    value_expression(expr)


# --- series -------------------------------------------------------------------------------------------
def _series(labels: dict[str, str], values: list[float], start: float = 1000.0, step: float = 10.0) -> RawSeries:
    return RawSeries(labels, [(start + i * step, v) for i, v in enumerate(values)])


def test_the_alerts_own_series_is_picked_among_the_hosts_gpus() -> None:
    gpus = [_series({"__name__": "DCGM_FI_DEV_GPU_TEMP", **dcgm_labels(i)}, [40.0 + i]) for i in range(8)]
    alert = {"alertname": "GPUTempCritical", "severity": "critical", "team": "ml", **dcgm_labels(3)}
    chosen = best_series(gpus, alert, frozenset({"alertname", "severity", "__name__"}))
    assert chosen is gpus[3]


def test_a_series_with_a_label_the_alert_lacks_is_not_the_alerts() -> None:
    series = [_series({"gpu": "1", "pod": "trainer"}, [1.0])]
    assert best_series(series, {"gpu": "1"}, frozenset()) is None
    # Related queries are lenient: labels the alert lacks, and instance/job, are not compared.
    assert best_series(series, {"gpu": "1", "instance": "k:8000"}, frozenset(), strict=False) is series[0]
    assert best_series(series, {"gpu": "2"}, frozenset(), strict=False) is None


def test_rule_labels_that_override_series_labels_are_ignored() -> None:
    series = [_series({"gpu": "1", "severity": "page"}, [1.0])]
    alert = {"gpu": "1", "severity": "critical"}
    assert best_series(series, alert, frozenset({"severity"})) is series[0]


def test_the_lenient_fallback_needs_a_shared_label_to_choose_among_several_series() -> None:
    other_hosts = [_series({"__name__": "up", "instance": f"k-ai-0{n}.lan:9400", "job": "dcgm"}, [0]) for n in (1, 2)]
    alert = {"alertname": "ExporterDown", "instance": "k-ai-07.lan:9400", "job": "dcgm"}
    assert best_series(other_hosts, alert, frozenset(), strict=False) is other_hosts[0]  # no label to tell them
    assert best_series(other_hosts, alert, frozenset(), strict=False, min_score=1) is None


def test_series_summary_gives_current_min_max_changes_and_a_sparkline() -> None:
    raw = _series({"__name__": "t", "gpu": "2"}, [62, 62, 70, 80, 93, 91])
    summary = series_summary("t", raw, start=1000, end=1050, step=10)
    assert summary.labels == {"gpu": "2"}
    assert summary.current == 91 and summary.current_text == "91"
    assert (summary.min, summary.max, summary.changes) == (62, 93, 4)
    assert summary.values[0] == (1000.0, 62)
    assert summary.sparkline == "▁▁▃▅██"  # one slot per point: no gaps between the samples of the grid


def test_a_minute_of_data_in_a_30_minute_window_shows_its_rise() -> None:
    end = 1000.0 + 1800
    rise = [60, 66, 72, 80, 86, 93]
    raw = RawSeries({"gpu": "2"}, [(end - 50 + 10 * i, float(v)) for i, v in enumerate(rise)])
    summary = series_summary("DCGM_FI_DEV_GPU_TEMP", raw, start=1000, end=end, step=10)
    assert summary.sparkline == "▁▂▃▅▇█"
    assert describe(summary, "30 min").startswith("current 93 (min 60, max 93 over 50 s) ")
    assert sparkline(raw.samples, 1000, end).strip() == "█"  # over the whole window the minute is one block


@pytest.mark.parametrize(
    ("query", "meaning"),
    [
        ("DCGM_FI_DEV_GPU_TEMP", ""),
        ('DCGM_FI_DEV_GPU_TEMP{gpu="2"}', ""),
        ("rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[10m])", "rate over 10m of DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
        ('DCGM_FI_DEV_XID_ERRORS{gpu="2"}', "last Xid code"),
        ("increase(DCGM_FI_DEV_XID_ERRORS[5m]) or DCGM_FI_DEV_XID_ERRORS", None),
        ("max_over_time(DCGM_FI_DEV_XID_ERRORS[1h])", None),
        ("sum(up)", ""),
    ],
)
def test_the_value_says_what_it_measures_or_nothing_where_it_misleads(query: str, meaning: str | None) -> None:
    assert value_meaning(query) == meaning


@given(st.text(alphabet="()[]{}_:=\"' abcrate5mDCGM_FI_DEV_XID_ERRORSincrease", max_size=80))
def test_any_expression_gets_a_meaning_or_none_never_an_error(query: str) -> None:
    meaning = value_meaning(query)
    assert meaning is None or isinstance(meaning, str)
    if "DCGM_FI_DEV_XID_ERRORS" not in query:
        assert meaning is not None


def test_a_series_that_stopped_before_now_has_no_current_value() -> None:
    raw = _series({"__name__": "ipmi_temperature_celsius"}, [31, 32, 33])  # points at 1000, 1010, 1020
    summary = series_summary("t", raw, start=1000, end=1050, step=10)
    assert summary.current is None and summary.current_text == "no data since 00:17 UTC"
    assert summary.max == 33  # its history stays


def test_nan_and_infinities_are_kept_out_of_values_but_shown_as_current() -> None:
    raw = RawSeries({}, [(1.0, 3.0), (2.0, math.nan), (3.0, 5.0), (4.0, math.inf)])
    summary = series_summary("q", raw, start=0, end=4, step=1)
    assert summary.values == [(1.0, 3.0), (3.0, 5.0)]
    assert summary.current is None and summary.current_text == "+Inf"
    assert (summary.min, summary.max) == (3.0, 5.0)
    json.dumps(summary.model_dump(mode="json"), allow_nan=False)  # storable as strict JSON


def test_all_nan_gives_no_numbers_and_an_empty_sparkline() -> None:
    summary = series_summary("q", RawSeries({}, [(1.0, math.nan), (2.0, math.nan)]), start=0, end=2, step=1)
    assert (summary.current, summary.min, summary.max, summary.current_text) == (None, None, None, "NaN")
    assert summary.sparkline == ""


def test_sparkline_rises_with_the_values_leaves_gaps_and_handles_flat_lines() -> None:
    rising = [(float(i), float(i)) for i in range(8)]
    assert sparkline(rising, 0, 8, width=8) == "▁▂▃▄▅▆▇█"
    gap = [(0.0, 1.0), (7.0, 2.0)]
    assert sparkline(gap, 0, 8, width=8) == "▁      █"
    assert sparkline([(0.0, 5.0), (4.0, 5.0)], 0, 8, width=8) == "▅   ▅"
    assert sparkline([], 0, 8) == ""
    # Several samples in one slot: the peak shows (or the trough, for `<` alerts).
    assert sparkline([(0.0, 0.0), (0.1, 10.0), (5.0, 5.0)], 0, 10, width=2) == "█▅"
    assert sparkline([(0.0, 0.0), (0.1, 10.0), (5.0, 5.0)], 0, 10, width=2, pick=min) == "▁▅"


@pytest.mark.parametrize(
    ("value", "text"),
    [(91.0, "91"), (0.0412, "0.0412"), (12.345, "12.35"), (1.5e10, "1.5e+10"), (math.nan, "NaN"), (None, "n/a")],
)
def test_values_are_formatted_for_people(value: float | None, text: str) -> None:
    assert format_value(value) == text


@pytest.mark.parametrize("seconds", [60, 1800, 86400, 30 * 86400])
def test_the_step_keeps_every_window_far_below_prometheus_point_limit(seconds: int) -> None:
    step = choose_step(0, seconds)
    assert step >= 1
    assert seconds / step + 1 <= TARGET_POINTS + 1 < 11_000


def test_inventory_accepts_old_and_new_label_spellings() -> None:
    found = [
        RawSeries({"gpu": "1", "uuid": "GPU-b", "pci_bus_id": "00000000:2A:00.0", "hostname": "h"}, []),
        RawSeries({"gpu": "0", "UUID": "GPU-a", "pci_bus_id": "00000000:18:00.0", "Hostname": "h"}, []),
        RawSeries({"gpu": "10", "UUID": "GPU-c", "Hostname": "h"}, []),
    ]
    inventory = gpu_inventory(found)
    assert [g["gpu"] for g in inventory] == ["0", "1", "10"]
    assert inventory[1] == {
        "gpu": "1",
        "UUID": "GPU-b",
        "pci_bus_id": "00000000:2A:00.0",
        "modelName": "",
        "Hostname": "h",
    }


# --- PromQL escaping ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "filled"),
    [
        ('3"} or vector(1) or {a="', 'x{gpu="3\\"} or vector(1) or {a=\\""}'),
        ("back\\slash", 'x{gpu="back\\\\slash"}'),
        ("new\nline", 'x{gpu="new\\nline"}'),
        ("k-ai-01", 'x{gpu="k-ai-01"}'),
    ],
)
def test_label_values_are_escaped_for_promql_strings(value: str, filled: str) -> None:
    assert fill_query('x{gpu="{gpu}"}', {"gpu": value}) == filled


def test_label_values_in_regex_matchers_are_regex_escaped_too() -> None:
    assert fill_query('x{instance=~"{host}:.*"}', {"host": "10.0.0.1"}) == 'x{instance=~"10\\\\.0\\\\.0\\\\.1:.*"}'


# --- the client and the enricher against a stub of the API --------------------------------------------
Handler = Callable[[httpx.Request], httpx.Response]


class StubPrometheus:
    """Answers /api/v1/* from a routing function and records every request (method, path, form/params)."""

    def __init__(self, route: Callable[[str, dict[str, str]], httpx.Response]) -> None:
        self.route = route
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.delay = 0.0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        fields = dict(urllib.parse.parse_qsl(request.content.decode())) if request.content else {}
        fields.update(dict(request.url.params))
        self.requests.append((request.method, request.url.path, fields))
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.route(request.url.path, fields)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def queries(self) -> list[str]:
        return [fields["query"] for _, path, fields in self.requests if "query" in fields]


def ok(data: Any) -> httpx.Response:
    return httpx.Response(200, json={"status": "success", "data": data})


def matrix(*series: tuple[dict[str, str], list[tuple[float, str]]]) -> httpx.Response:
    return ok({"resultType": "matrix", "result": [{"metric": m, "values": v} for m, v in series]})


def vector(*labels: dict[str, str]) -> httpx.Response:
    return ok({"resultType": "vector", "result": [{"metric": m, "value": [1.0, "1"]} for m in labels]})


def rules(*rules: dict[str, Any]) -> httpx.Response:
    full = [{"type": "alerting", "labels": {}, "health": "ok", "annotations": {}, **r} for r in rules]
    return ok({"groups": [{"name": "gpu", "file": "gpu.yml", "rules": full}]})


def make_alert(labels: dict[str, str], generator_url: str = "") -> AlertState:
    return alert_state(labels, starts_at=datetime.now(UTC) - timedelta(minutes=1), key="k", generator_url=generator_url)


async def run(
    stub: StubPrometheus, alert: AlertState, playbook: Playbook | None = None, timeout: float = 2.0
) -> EnrichmentSection:
    config = PrometheusConfig(url=PROMETHEUS)
    enricher = PrometheusEnricher(config, timeout, PrometheusClient(config, transport=stub.transport()))
    try:
        return await enricher.enrich(EnrichmentRequest(alert, playbook, {}))
    finally:
        await enricher.close()


HOT = dcgm_labels(3, hostname="k-ai-01")
NOW = datetime.now(UTC).timestamp()


def temperatures(path: str, fields: dict[str, str]) -> httpx.Response:
    if path == "/api/v1/query":
        return vector(*(dcgm_labels(i, hostname="k-ai-01") for i in range(8)))
    if path == "/api/v1/rules":
        return rules(
            {"name": "GPUTempCritical", "query": "DCGM_FI_DEV_GPU_TEMP > 95", "labels": {"severity": "page"}},
            {"name": "GPUTempCritical", "query": "DCGM_FI_DEV_GPU_TEMP > 87", "labels": {"severity": "critical"}},
        )
    end = float(fields["end"])  # like Prometheus, the newest point of a live series is at the query's end
    return matrix(
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **dcgm_labels(2, hostname="k-ai-01")}, [(end - 60, "50")]),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **HOT}, [(end - 60, "62"), (end - 30, "NaN"), (end, "91")]),
    )


async def test_expression_comes_from_the_generator_url_and_the_configured_prometheus_is_asked() -> None:
    stub = StubPrometheus(temperatures)
    url = "http://unreachable-prometheus.internal:9090/graph?g0.expr=DCGM_FI_DEV_GPU_TEMP+%3E+87&g0.tab=1"
    labels = {"alertname": "GPUTempCritical", "severity": "critical", **HOT}
    section = await run(stub, make_alert(labels, url))
    assert section.status == "ok"
    method, path, form = stub.requests[0] if stub.requests[0][1] == "/api/v1/query_range" else stub.requests[1]
    assert (method, path) == ("POST", "/api/v1/query_range")
    # Narrowed to the alert's own series by its host and GPU labels, never the whole fleet's.
    assert form["query"].startswith('DCGM_FI_DEV_GPU_TEMP{Hostname="k-ai-01", UUID="GPU-')
    assert 'gpu="3", pci_bus_id="00000000:5D:00.0"}' in form["query"]
    assert float(form["step"]) >= 1 and (float(form["end"]) - float(form["start"])) / float(form["step"]) <= 240
    history = section.data.history
    assert history.labels["gpu"] == "3"
    assert (history.current, history.min, history.max) == (91.0, 62.0, 91.0)
    assert section.summary.startswith("current 91 (min 62, max 91 over 1 min) ")  # the minute with data
    assert section.summary.endswith(" · fires when > 87")
    assert all(path != "/api/v1/rules" for _, path, _ in stub.requests)


async def test_without_a_generator_url_the_rule_comes_from_the_rules_api_by_name_and_labels() -> None:
    stub = StubPrometheus(temperatures)
    labels = {"alertname": "GPUTempCritical", "severity": "critical", **HOT}
    alerts = [make_alert(labels) for _ in range(5)]
    config = PrometheusConfig(url=PROMETHEUS)
    enricher = PrometheusEnricher(config, 2.0, PrometheusClient(config, transport=stub.transport()))
    try:
        sections = await asyncio.gather(*(enricher.enrich(EnrichmentRequest(a, None, {})) for a in alerts))
    finally:
        await enricher.close()
    assert {s.data.expr for s in sections} == {"DCGM_FI_DEV_GPU_TEMP > 87"}  # the rule with severity critical
    assert {s.data.expr_source for s in sections} == {"rules"}
    # Prometheus 2.42 has no rule_name[] filter: one unfiltered call, shared by the alerts arriving together.
    rule_calls = [fields for _, path, fields in stub.requests if path == "/api/v1/rules"]
    assert rule_calls == [{"type": "alert"}]


async def test_an_alert_no_rule_explains_has_no_history_but_still_a_section() -> None:
    stub = StubPrometheus(temperatures)
    section = await run(stub, make_alert({"alertname": "Synthetic", "Hostname": "k-ai-01"}))
    assert section.status == "ok"
    assert section.data.history is None
    assert section.summary == (
        "History unavailable: the alert's generatorURL is empty and Prometheus has no alerting rule named 'Synthetic'"
    )


async def test_related_queries_are_filled_escaped_and_never_sent_half_filled() -> None:
    stub = StubPrometheus(temperatures)
    hostile = {**HOT, "Hostname": 'k-ai-01"} or vector(1) or {a="'}
    playbook = Playbook(
        title="t",
        queries={
            "temperature": 'DCGM_FI_DEV_GPU_TEMP{Hostname="{Hostname}", gpu="{gpu}"}',
            "needs_pod": 'DCGM_FI_DEV_GPU_UTIL{pod="{pod}"}',
        },
    )
    section = await run(stub, make_alert({"alertname": "GPUXidError", **hostile}), playbook)
    sent = stub.queries()
    assert 'DCGM_FI_DEV_GPU_TEMP{Hostname="k-ai-01\\"} or vector(1) or {a=\\"", gpu="3"}' in sent
    assert not any("pod=" in q for q in sent)
    assert section.data.unavailable["needs_pod"] == "the alert has no label pod"
    assert "needs_pod: unavailable (the alert has no label pod)" in section.lines


async def test_api_errors_are_read_from_the_json_envelope() -> None:
    def route(path: str, fields: dict[str, str]) -> httpx.Response:
        return httpx.Response(
            400,
            json={
                "status": "error",
                "errorType": "bad_data",
                "error": 'invalid parameter "query": 1:4: parse error: unexpected end of input inside braces',
            },
        )

    stub = StubPrometheus(route)
    client = PrometheusClient(PrometheusConfig(url=PROMETHEUS), transport=stub.transport())
    try:
        with pytest.raises(QueryError) as caught:
            await client.query_range("up{", 0, 60, 15, Deadline(2))
    finally:
        await client.close()
    assert caught.value.reason == "http_400"
    assert caught.value.detail == (
        'Prometheus answered HTTP 400: bad_data: invalid parameter "query": 1:4: parse error: unexpected end of '
        "input inside braces"
    )
    assert len(stub.requests) == 1


async def test_errors_off_the_api_are_plain_text() -> None:
    stub = StubPrometheus(lambda path, fields: httpx.Response(404, text="404 page not found\n"))
    section = await run(stub, make_alert({"alertname": "GPUTempCritical", **HOT}, CAPTURED_URL))
    assert section.status == "unavailable"
    assert section.reason == "Prometheus answered HTTP 404: 404 page not found"


async def test_unavailable_and_malformed_answers_are_retried_or_reported() -> None:
    answers = iter([httpx.Response(503, text="Service Unavailable"), matrix(({"gpu": "3"}, [(NOW, "1")]))])
    stub = StubPrometheus(lambda path, fields: next(answers))
    client = PrometheusClient(PrometheusConfig(url=PROMETHEUS), transport=stub.transport())
    try:
        series = await client.query_range("x", 0, 60, 15, Deadline(2))
        stub.route = lambda path, fields: httpx.Response(200, text="<html>proxy login</html>")
        with pytest.raises(QueryError, match="not JSON"):
            await client.query_range("x", 0, 60, 15, Deadline(2))
    finally:
        await client.close()
    assert series == [RawSeries({"gpu": "3"}, [(NOW, 1.0)])]
    assert len(stub.requests) == 3


async def test_a_slow_prometheus_costs_no_more_than_the_deadline() -> None:
    stub = StubPrometheus(temperatures)
    stub.delay = 30
    section = await run(stub, make_alert({"alertname": "GPUTempCritical", **HOT}, CAPTURED_URL), timeout=0.2)
    assert section.status == "unavailable"
    assert section.reason == "no answer from Prometheus within 0.2 s"

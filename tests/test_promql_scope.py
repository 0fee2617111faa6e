"""The PromQL rewrite that narrows an alert's history to its host (bot/enrich/prometheus/scope.py), read by
promql-parser: keywords in any case, every aggregation, an IPv6 instance in the GPU inventory, and a narrowed
query Prometheus refuses read unnarrowed. Against the real Prometheus over a corpus of rules:
tests/test_promql_corpus.py."""

from __future__ import annotations

import re
import urllib.parse
from datetime import UTC, datetime, timedelta

import httpx
import promql_parser as pp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import PrometheusConfig
from bot.enrich.base import EnrichmentRequest
from bot.enrich.prometheus import PrometheusClient, PrometheusEnricher
from bot.enrich.prometheus.plan import inventory_host, inventory_query
from bot.enrich.prometheus.scope import grouped, scope_labels, scoped
from bot.enrich.prometheus.unparse import unparse
from tests.support.payloads import alert_state

HOST = {"instance": ["k-ai-01:9400"]}


def test_a_trailing_uppercase_by_is_one_grouping() -> None:
    # `sum(x) BY (...)`: the labels join its list; before, a second `by` made a query Prometheus refused.
    assert grouped("sum(x) BY (instance, name) > 1", ["Hostname"]) == "sum by (instance, name, Hostname) (x) > 1"
    assert grouped("sum(x) BY (instance, name) > 1", ["instance"]) == "sum(x) BY (instance, name) > 1"
    assert scoped("sum(rate(x[5m])) BY (instance, name)", HOST) == (
        'sum by (instance, name) (rate(x{instance="k-ai-01:9400"}[5m]))'
    )


@pytest.mark.parametrize("words", ["SUM BY", "sum By", "Sum bY", "MAX by", "avg BY"])
def test_keywords_are_read_in_any_case(words: str) -> None:
    aggregation, by = words.split()
    expr = f"{aggregation} {by} (instance) (node_load1) > 4"
    assert scoped(expr, HOST) == f'{aggregation.lower()} by (instance) (node_load1{{instance="k-ai-01:9400"}}) > 4'
    assert scope_labels(f"{aggregation} {by} (job) (node_load1)", ["instance"]) == []
    assert scope_labels(f"{aggregation} WITHOUT (cpu) (node_load1)", ["instance"]) == ["instance"]


def test_count_values_is_an_aggregation() -> None:
    expr = 'count_values by (instance) ("version", node_uname_info) > 1'
    assert scoped(expr, HOST) == (
        'count_values by (instance) ("version", node_uname_info{instance="k-ai-01:9400"}) > 1'
    )
    assert scoped('count_values("version", node_uname_info)', HOST) == 'count_values("version", node_uname_info)'
    # The value label replaces the series' own: never narrowed by it.
    assert scope_labels('count_values by (gpu) ("gpu", x)', ["gpu"]) == []


def test_an_ipv6_instance_finds_its_hosts_gpus_in_the_inventory() -> None:
    query = pp.parse(inventory_query(["fd00::7", "k-ai-01"], 3600))
    found: list[str] = []

    def instance_matchers(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            found.extend(m.value for m in node.matchers.matchers if m.name == "instance")

    pp.walk(query, instance_matchers)
    [pattern] = set(found)  # one pattern on every leg; RE2 as Prometheus anchors it, the same in Python's re here
    for instance in ("[fd00::7]:9400", "fd00::7", "k-ai-01:9400", "k-ai-01"):
        assert re.fullmatch(pattern, instance), instance
    for other in ("[fd00::70]:9400", "fd00::7:9400x", "k-ai-010:9400"):
        assert not re.fullmatch(pattern, other), other
    assert inventory_host({"instance": "[fd00::7]:9400"}) == ("fd00::7",)


def test_what_cannot_be_narrowed_stays_as_it_is() -> None:
    for expr in (
        "absent(up{job='node'})",
        "sum(x)",
        "x / sum(x)",
        "label_replace(x, 'instance', '$1', 'host', '(.*)')",
        "x * on (job) group_left y",
        "topk(3, x)",
        "sum without (instance) (x)",
        "not promql (",
    ):
        assert scoped(expr, HOST) == expr, expr
    assert grouped("x / sum(x)", ["instance"]) is None
    assert grouped("sum without (gpu) (x)", ["instance"]) is None


def test_matching_on_the_label_keeps_it_narrowable() -> None:
    expr = "x * on (instance) group_left (nodename) node_uname_info"
    assert scoped(expr, HOST) == (
        'x{instance="k-ai-01:9400"} * on (instance) group_left (nodename) node_uname_info{instance="k-ai-01:9400"}'
    )
    assert scope_labels("x / ignoring (instance) y", ["instance", "gpu"]) == ["gpu"]


# --- properties: any expression the parser reads is printed back as the same tree ---------------------
_NAMES = st.sampled_from(["up", "node_load1", "DCGM_FI_DEV_GPU_TEMP", "x:rate5m", "http_requests_total"])
_LABELS = st.sampled_from(["instance", "job", "gpu", "Hostname", "mode"])
_VALUES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)


@st.composite
def _selector(draw: st.DrawFn) -> str:
    matchers = draw(st.lists(st.tuples(_LABELS, st.sampled_from(["=", "!=", "=~", "!~"]), _VALUES), max_size=2))
    inner = ", ".join(f'{name}{op}"{_go_string(value)}"' for name, op, value in matchers if op == "=" or value)
    text = draw(_NAMES) + (f"{{{inner}}}" if inner else "")
    if draw(st.booleans()):
        text += f"[{draw(st.sampled_from(['5m', '1h30m', '90s']))}]"
        text = f"{draw(st.sampled_from(['rate', 'max_over_time', 'increase', 'DELTA']))}({text})"
    if draw(st.booleans()):
        text += f" offset {draw(st.sampled_from(['5m', '-1h', '1d']))}"
    return text


def _go_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    by = st.sampled_from(["by", "BY", "By", "without", "WITHOUT"])
    aggregation = st.sampled_from(["sum", "SUM", "max", "Min", "avg", "count", "group", "stddev"])
    labels = st.lists(_LABELS, max_size=2, unique=True).map(", ".join)
    return st.one_of(
        st.tuples(aggregation, by, labels, children).map(lambda t: f"{t[0]} {t[1]} ({t[2]}) ({t[3]})"),
        st.tuples(aggregation, children, by, labels).map(lambda t: f"{t[0]}({t[1]}) {t[2]} ({t[3]})"),
        st.tuples(children, labels).map(lambda t: f'count_values by ({t[1]}) ("v", {t[0]})'),
        st.tuples(
            children, st.sampled_from(["+", "/", ">", "> bool", "and", "or", "unless", "== on (job)"]), children
        ).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        st.tuples(children, st.integers(-5, 5)).map(lambda t: f"({t[0]}) * {t[1]}"),
        children.map(lambda c: f"-{c}"),
        children.map(lambda c: f"abs({c})"),
        children.map(lambda c: f"max_over_time(({c})[30m:1m])"),
    )


EXPRESSIONS = st.recursive(_selector(), _extend, max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(EXPRESSIONS)
def test_a_rewrite_is_the_same_tree_with_the_matchers_added(expr: str) -> None:
    try:
        tree = pp.parse(expr)
    except ValueError:
        assert scoped(expr, HOST) == expr
        return
    printed = unparse(tree)
    assert pp.parse(printed).prettify() == tree.prettify()
    rewritten = scoped(expr, {"instance": ["k-ai-01:9400", "[fd00::7]:9400"]})
    if rewritten == expr:
        return
    selectors = _selectors(pp.parse(rewritten))
    assert selectors
    wanted = ("instance", r"\[fd00::7\]:9400|k-ai-01:9400")
    assert all(wanted in {(m.name, m.value) for m in s.matchers.matchers} for s in selectors), rewritten


def _selectors(tree: pp.Expr) -> list[pp.VectorSelector]:
    found: list[pp.VectorSelector] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.VectorSelector):
            found.append(node)
        elif isinstance(node, pp.MatrixSelector):
            found.append(node.vector_selector)

    pp.walk(tree, visit)
    return found


@given(st.text(max_size=80))
def test_any_text_is_narrowed_or_left_as_it_is_never_an_error(text: str) -> None:
    assert isinstance(scoped(text, HOST), str)
    grouped(text, ["instance"])


# --- a narrowed query Prometheus refuses --------------------------------------------------------------
async def test_a_refused_narrowed_history_query_is_read_unnarrowed() -> None:
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        form = dict(urllib.parse.parse_qsl(request.content.decode()))
        if request.url.path == "/api/v1/query":
            return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})
        sent.append(form["query"])
        if "k-ai-01" in form["query"]:  # whatever the rewrite, say Prometheus cannot read it
            return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"})
        end = float(form["end"])
        series = [
            {"metric": {"instance": host, "job": "dcgm"}, "values": [[end - 60, "40"], [end, str(value)]]}
            for host, value in (("k-ai-01:9400", 91), ("k-ai-02:9400", 50))
        ]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix", "result": series}})

    labels = {"alertname": "GPUHot", "instance": "k-ai-01:9400", "job": "dcgm", "severity": "critical"}
    url = "http://prometheus:9090/graph?g0.expr=" + urllib.parse.quote_plus("DCGM_FI_DEV_GPU_TEMP > 87")
    alert = alert_state(labels, starts_at=datetime.now(UTC) - timedelta(minutes=1), key="k", generator_url=url)
    config = PrometheusConfig(url="http://prometheus.test:9090")
    client = PrometheusClient(config, transport=httpx.MockTransport(answer))
    enricher = PrometheusEnricher(config, 2.0, client)
    try:
        section = await enricher.enrich(EnrichmentRequest(alert, None, {}))
    finally:
        await enricher.close()
    assert sent == ['DCGM_FI_DEV_GPU_TEMP{instance="k-ai-01:9400"}', "DCGM_FI_DEV_GPU_TEMP"]
    assert section.status == "ok", section
    assert section.data.history is not None and section.data.history.current == 91.0
    assert section.data.history.labels["instance"] == "k-ai-01:9400"

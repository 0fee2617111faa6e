"""The PromQL rewrite over a corpus of alerting rules (tests/fixtures/promql/alert_rules.txt: the forms of
public rule sets, and the edges that broke it), on a real Prometheus 2.42 holding two hosts' series of every
metric the corpus names (one of them an IPv6 target, `[fd00::7]:9400`):

- Prometheus accepts every rewritten query: the narrowed history query of the rule and of its graphed value, and
  the regrouped one a batch shares;
- a narrowed query answers exactly the series of the whole expression's answer that carry the alert's value,
  never another host's; a regrouped one answers, per host, what the query filled for that host answers.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser as pp
import pytest

from bot.enrich.prometheus.promql import value_expression
from bot.enrich.prometheus.scope import grouped, scoped
from bot.enrich.prometheus.unparse import Rewrite, unparse
from tests.support.processes import Prometheus, backfill

pytestmark = pytest.mark.realstack

CORPUS = Path(__file__).parent / "fixtures" / "promql" / "alert_rules.txt"
HOSTS = {"k-ai-01:9400": "k-ai-01", "[fd00::7]:9400": "fd00::7"}
JOBS = {
    "node_": "node",
    "kube_": "kube-state-metrics",
    "kubelet_": "kubelet",
    "apiserver_": "apiserver",
    "aggregator_": "apiserver",
    "prometheus_": "prometheus",
    "alertmanager_": "alertmanager",
    "etcd_": "etcd",
    "grpc_": "etcd",
    "coredns_": "coredns",
    "DCGM_": "dcgm",
    "probe_": "blackbox",
}
UP_JOBS = ("node", "kubelet", "kube-state-metrics", "apiserver", "prometheus", "alertmanager", "dcgm", "etcd")


def expressions() -> list[str]:
    lines = (line.strip() for line in CORPUS.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def metric_names(exprs: list[str]) -> set[str]:
    names: set[str] = set()

    def visit(node: pp.Expr) -> None:
        selector = node.vector_selector if isinstance(node, pp.MatrixSelector) else node
        if isinstance(selector, pp.VectorSelector):
            names.update([selector.name] if selector.name else [])
            names.update(m.value for m in selector.matchers.matchers if m.name == "__name__" and m.value.isidentifier())

    for expr in exprs:
        pp.walk(pp.parse(expr), visit)
    return names


def series_of(name: str) -> dict[str, float]:
    """Two series per host of the metric, with the labels the corpus's rules select by."""
    found: dict[str, float] = {}
    jobs = UP_JOBS if name == "up" else [next((j for p, j in JOBS.items() if name.startswith(p)), "app")]
    buckets = ["0.1", "1", "10", "+Inf"] if name.endswith("_bucket") else [""]
    for instance, host in HOSTS.items():
        for index in ("0",) if name.endswith("_info") else ("0", "1"):
            for job in jobs:
                for rank, le in enumerate(buckets):
                    labels = {
                        "instance": instance,
                        "Hostname": host,
                        "job": job,
                        "gpu": index,
                        "cpu": index,
                        "mode": ("idle", "user")[int(index)],
                        "device": f"sd{'ab'[int(index)]}",
                        "mountpoint": "/",
                        "fstype": "ext4",
                        "namespace": "default",
                        "pod": f"p-{index}",
                        "container": "c",
                        "name": f"c-{index}",
                        **({"le": le} if le else {}),
                    }
                    text = "{" + ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items())) + "}"
                    digest = hashlib.sha256(f"{name}{text}".encode()).digest()
                    found[f"{name}{text}"] = 1 + digest[0] % 97 + rank * 100
    return found


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass
class Stack:
    prometheus: Prometheus
    at: float
    http: httpx.Client

    def instant(self, query: str) -> list[dict[str, Any]] | str:
        """The answer's series, or Prometheus's error when it refuses the query."""
        answer = self.http.post(f"{self.prometheus.url}/api/v1/query", data={"query": query, "time": self.at})
        body = answer.json()
        if answer.status_code != 200:
            return f"HTTP {answer.status_code}: {body.get('error')}"
        result: list[dict[str, Any]] = body["data"]["result"] if body["data"]["resultType"] == "vector" else []
        return result


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("corpus")
    now = time.time()
    series: dict[str, float] = {}
    for name in sorted(metric_names(expressions())):
        series.update(series_of(name))
    backfill(workdir, series, start=now - 7200, end=now - 60, interval=60.0)
    prometheus = Prometheus(workdir, {"global": {"scrape_interval": "1m"}})
    try:
        with httpx.Client(timeout=30) as http:
            yield Stack(prometheus, now - 60, http)
    finally:
        prometheus.stop()


def _key(series: dict[str, Any], drop: str = "") -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in series["metric"].items() if k != drop))


def _same(got: list[dict[str, Any]], wanted: list[dict[str, Any]], drop: str = "") -> bool:
    mine = {_key(s, drop): float(s["value"][1]) for s in got}
    theirs = {_key(s, drop): float(s["value"][1]) for s in wanted}
    return mine.keys() == theirs.keys() and all(
        (math.isnan(v) and math.isnan(theirs[k])) or math.isclose(v, theirs[k], rel_tol=1e-9, abs_tol=1e-12)
        for k, v in mine.items()
    )


def _queries() -> list[str]:
    return list(dict.fromkeys(q for expr in expressions() for q in (expr, value_expression(expr).query)))


def test_the_corpus_is_large_varied_and_read_by_the_parser() -> None:
    exprs = expressions()
    assert len(exprs) >= 300
    for expr in exprs:
        pp.parse(expr)  # raises for an expression promql-parser cannot read
    text = "\n".join(exprs)
    for edge in (") BY (", "SUM BY", "By (", "count_values by", "[fd00::7]:9400", "holt_winters", "@ end()"):
        assert edge in text, edge


def test_every_rewritten_query_is_accepted_and_narrowed_to_the_alerts_series_only(stack: Stack) -> None:
    refused: list[str] = []
    wrong: list[str] = []
    narrowed = compared = 0
    for query in _queries():
        whole = stack.instant(query)
        assert not (isinstance(whole, str) and whole.startswith("HTTP 400")), f"{query}: {whole}"
        for label in ("instance", "Hostname"):
            found = [] if isinstance(whole, str) else whole
            values = sorted({s["metric"][label] for s in found if label in s["metric"]}) or sorted(HOSTS)
            for wanted in [[value] for value in values] + [values]:
                rewritten = scoped(query, {label: wanted})
                if rewritten == query:
                    continue
                narrowed += 1
                answer = stack.instant(rewritten)
                if isinstance(answer, str):
                    # A query whose evaluation fails on these series (422: one-to-one matching of several
                    # series) may fail narrowed too; never as one Prometheus cannot read.
                    if not isinstance(whole, str) or answer.startswith("HTTP 400"):
                        refused.append(f"{rewritten}: {answer}")
                    continue
                if isinstance(whole, str):
                    continue
                compared += bool(answer)
                if not _same(answer, [s for s in whole if s["metric"].get(label) in wanted]):
                    wrong.append(f"{query} narrowed by {label}={wanted}: {rewritten}")
    assert refused == [], "\n".join(refused[:20])
    assert wrong == [], "\n".join(wrong[:20])
    print(f"{narrowed} narrowed queries, {compared} compared with series in their answer")
    assert narrowed > 500 and compared > 300  # most of the corpus is narrowed, by both labels, and has data


def test_every_regrouped_query_answers_per_host_what_the_hosts_own_query_answers(stack: Stack) -> None:
    refused: list[str] = []
    wrong: list[str] = []
    regrouped = 0
    alternation = "|".join(value.replace("[", "\\[").replace("]", "\\]") for value in sorted(HOSTS))
    for query in _queries():
        tree = pp.parse(query)
        # A playbook template filled for a batch of hosts (`instance=~"a|b"`), as fill_shared does.
        shared = unparse(tree, Rewrite(matchers=[("instance", "=~", alternation)]))
        together = grouped(shared, ["instance"])
        if together is None:
            continue
        regrouped += 1
        answer = stack.instant(together)
        if isinstance(answer, str):
            if answer.startswith("HTTP 400") or not isinstance(stack.instant(shared), str):
                refused.append(f"{together}: {answer}")
            continue
        for instance in HOSTS:
            own = stack.instant(unparse(tree, Rewrite(matchers=[("instance", "=", instance)])))
            if isinstance(own, str):
                wrong.append(f"{query} for {instance}: {own}")
                continue
            part = [s for s in answer if s["metric"].get("instance") == instance]
            if not _same(part, own, drop="instance"):
                wrong.append(f"{query} for {instance}: {together}")
    assert refused == [], "\n".join(refused[:20])
    assert wrong == [], "\n".join(wrong[:20])
    print(f"{regrouped} regrouped queries")
    assert regrouped > 300

"""Cooling cascade benchmark: one row's cooling fails on a fleet (300 hosts of 8 GPUs by default, the row 50 of them)
while an unrelated Xid burst hits 8 hosts of another row, all through real parts.

A real Prometheus scrapes a synthetic fleet (each host its own target, its rack and row from file_sd, two GPU
models) and evaluates the shipped GPU and chassis rules (`for:` and intervals cut to 1 s, expressions untouched); a
real Alertmanager with the shipped grouping (per alertname and host) and inhibitions, its group_wait and
group_interval shortened, delivers to one `gpu-alert-bot serve`, which tells Slack (the fake, 1 post a second),
PagerDuty (the fake, 120 events a minute) and a real SMTP server, and asks that Prometheus for its evidence.

The row's inlet air warms first (InletTemperatureHigh); once the bot's first card is up, its GPUs overheat
(GPUTempCritical, GPUMemoryTempHigh warning and critical, GPUThermalThrottling, and GPUTemperatureRising as the
quick rules let it) and the Xid burst starts. Printed: the incidents each receiver got (Slack cards, PagerDuty
incident alerts, mail threads), Slack's posts in the row's incident, how long after the first webhook the first
card named facility cooling, how long after its own arrival each alert was findable in Slack (its id shown, its
alertname on its host's line, or in the attached list; the worst and the median), and the incident analyses and
Prometheus queries the bot made.

    .venv/bin/python -m bench.cascade [--hosts 300] [--row 50] [--gpus 8] [--limit 240]

It prints figures; it asserts nothing. The machine's load from other processes counts in them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sqlite3
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import closing
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.common import serve
from bench.fleet import prometheus_requests
from bench.slackview import shown_ids, visible
from bot.models import short_id
from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import FakeSlack
from tests.support.cooling import alert_to, healthy_fleet, overheat, shipped_alertmanager_config, warm_inlet, xid_burst
from tests.support.fleet import SyntheticFleet
from tests.support.pagerduty_receiver import pagerduty_receiver
from tests.support.processes import Alertmanager, Prometheus
from tests.support.rules import SHIPPED_RULES, quick_rules
from tests.support.slack_receiver import slack_receiver
from tests.test_email import smtp_server

ROWS = "ABCDEF"
HOT_ROW = "C"
_POLL = 0.2


def layout(hosts: int, row: int) -> dict[str, str]:
    """host -> rack: rows of `row` hosts, racks of 10."""
    return {f"gpu-{n:03d}": f"{ROWS[n // row % len(ROWS)]}{n % row // 10 + 1}" for n in range(hosts)}


def scraped(prometheus: Prometheus, hosts: int) -> bool:
    query = urllib.parse.quote(f"count(count_over_time(up[1m]) >= 2) == {hosts}")
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?query={query}", timeout=5) as answer:  # noqa: S310
        return bool(json.load(answer)["data"]["result"])


Alert = tuple[str, str, str]


def stored_alerts(db: Path) -> dict[Alert, tuple[float, frozenset[str]]]:
    """(alertname, host, gpu) -> when the bot first heard of it (its store's clock) and the ids of its stored
    alerts (a warning and a critical alert of one GPU are two), for every stored alert."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT key, alertname, labels, first_seen FROM alerts").fetchall()
    found: dict[Alert, tuple[float, frozenset[str]]] = {}
    for alert_key, alertname, labels, first_seen in rows:
        parsed = json.loads(labels)
        key = (alertname, parsed.get("host", ""), parsed.get("gpu", parsed.get("name", "")))
        heard, ids = found.get(key, (first_seen, frozenset()))
        found[key] = (min(first_seen, heard), ids | {short_id(alert_key)})
    return found


def findable(slack: FakeSlack, alertname: str) -> set[tuple[str, str]]:
    """(host, gpu) of `alertname`'s alerts a person finds in Slack; an alert naming no GPU (the inlet's) by its
    host's line or its own message."""
    seen = visible(slack, alertname)
    hosts = {host for host, _ in seen}
    line = re.compile(rf"`([^`]+)` · [^\n]*{re.escape(alertname)}")
    for message in slack.top_level():
        for text in [message.rendered_text(), *(r.rendered_text() for r in slack.replies(message))]:
            hosts.update(m.group(1) for m in line.finditer(text))
    return seen | {(host, "") for host in hosts}


def bot_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:  # noqa: S310 (loopback)
        text = answer.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("gpu_alert_bot_incident") or family.name == "gpu_alert_bot_events":
            for sample in family.samples:
                if sample.name.endswith(("_total", "_sum", "_count")):
                    tag = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    found[f"{sample.name}{{{tag}}}" if tag else sample.name] = sample.value
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    racks = layout(args.hosts, args.row)
    hot = [h for h, rack in racks.items() if rack[0] == HOT_ROW]
    burst = [h for h, rack in racks.items() if rack[0] == "E"][:8]
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-cascade-") as tmp, healthy_fleet(racks, args.gpus) as fleet:
        work = Path(tmp)
        rules = quick_rules([SHIPPED_RULES / "gpu-alerts.yml", SHIPPED_RULES / "hardware-alerts.yml"], work / "r.yml")
        scrape = fleet.scrape_config(work / "targets.json", {h: {"rack": r} for h, r in racks.items()}, interval="2s")
        prometheus = Prometheus(work / "prom", scrape, [rules])
        try:
            with smtp_server("plain") as (port, mails):
                async with FakePagerDuty() as pagerduty, FakeSlack() as slack:
                    slack.enforce_rate(1.0)
                    return await _measured(args, work, prometheus, fleet, hot, burst, port, mails, pagerduty, slack)
        finally:
            prometheus.stop()


async def _measured(
    args: argparse.Namespace,
    work: Path,
    prometheus: Prometheus,
    fleet: SyntheticFleet,
    hot: list[str],
    burst: list[str],
    smtp_port: int,
    mails: Any,
    pagerduty: FakePagerDuty,
    slack: FakeSlack,
) -> dict[str, Any]:
    receivers = [
        slack_receiver(work, slack, timeout="10s", messages_per_second=1.0),
        {"type": "email", "name": "mail", "to": ["oncall@example.com"], "from": "bot@example.com",
         "smarthost": f"127.0.0.1:{smtp_port}", "security": "none", "allow_plaintext": True},
        pagerduty_receiver(work, pagerduty),
    ]  # fmt: skip
    settings = {
        "receivers": receivers,
        "routing": {"default": ["slack", "mail", "pd"]},
        "enrichment": {"prometheus": {"url": prometheus.url, "history": "2m"}},
    }
    with serve(work, settings) as (url, _process):
        alertmanager = Alertmanager(work / "am", shipped_alertmanager_config(url, group_interval="5s"))
        try:
            alert_to(prometheus, alertmanager.url)
            await _first(lambda: scraped(prometheus, args.hosts), args.limit)
            asked = prometheus_requests(prometheus.url)
            warm_inlet(fleet, hot)
            warmed = time.time()
            cause_seen = await _first(lambda: _card_naming(slack, "Facility cooling"), args.limit)
            overheat(fleet, hot, args.gpus)
            xid_burst(fleet, burst)
            seen = await _follow(slack, work / "bot.db", args.limit)
            await asyncio.sleep(15)  # the incidents settle (10 s) and are read again
            metrics = bot_metrics(_worker_url(url))
            received = prometheus_requests(prometheus.url)
        finally:
            alertmanager.stop()
        first = min((heard for heard, _ in seen.values()), default=warmed)
        return _figures(slack, pagerduty, mails, seen, first, cause_seen, received - asked, metrics)


def _worker_url(url: str) -> str:
    """The worker process's own /metrics: `worker.metrics_listen`, by default the next port."""
    host, port = url.rsplit(":", 1)
    return f"{host}:{int(port) + 1}"


async def _first(check: Any, limit: float) -> float | None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return time.time()
        await asyncio.sleep(_POLL)
    return None


def _card_naming(slack: FakeSlack, words: str) -> bool:
    return any(words in m.rendered_text() and "*Scope:*" in m.rendered_text() for m in slack.top_level())


async def _follow(slack: FakeSlack, db: Path, limit: float) -> dict[Alert, tuple[float, float]]:
    """Each stored alert: (when the bot heard of it, when it was first findable in Slack), until every alert of
    the cascade and the burst is findable and none arrived for 10 s, or `limit` seconds."""
    found: dict[Alert, float] = {}
    deadline = time.monotonic() + limit
    quiet_since = time.monotonic()
    known = 0
    while time.monotonic() < deadline:
        stored = stored_alerts(db)
        if len(stored) != known:
            known, quiet_since = len(stored), time.monotonic()
        names = {alertname for alertname, _, _ in stored}
        visible_now = {(name, host, gpu) for name in names for host, gpu in findable(slack, name)}
        ids = shown_ids(slack)
        now = time.time()
        for key, (_, own_ids) in stored.items():
            if key not in found and (key in visible_now or (key[0], key[1], "") in visible_now or own_ids <= ids):
                found[key] = now
        if stored and len(found) == len(stored) and time.monotonic() - quiet_since > 10:
            break
        await asyncio.sleep(_POLL)
    return {key: (heard, found.get(key, float("inf"))) for key, (heard, _) in stored_alerts(db).items()}


def _figures(
    slack: FakeSlack,
    pagerduty: FakePagerDuty,
    mails: Any,
    seen: dict[Alert, tuple[float, float]],
    first_webhook: float,
    cause_seen: float | None,
    queries: int,
    metrics: dict[str, float],
) -> dict[str, Any]:
    cards = [m for m in slack.top_level() if "*Scope:*" in m.rendered_text()]
    row = [m for m in cards if "Facility cooling" in m.rendered_text()]
    posts_in_row = 0
    if row:
        posts_in_row = 1 + len(slack.replies(row[0]))
    delays = sorted(found - heard for heard, found in seen.values())
    received = [m.mail for m in mails.received()]
    roots = {str(m.get("In-Reply-To") or m["Message-ID"]) for m in received if "INCIDENT" in m["Subject"]}
    return {
        "alerts": len(seen),
        "alertnames": sorted({name for name, _, _ in seen}),
        "slack_incident_cards": len(cards),
        "slack_posts_of_the_rows_incident": posts_in_row,
        "slack_top_level_posts": len(slack.top_level()),
        "pagerduty_incident_alerts": len([k for k in pagerduty.alerts if k.startswith("incident:")]),
        "pagerduty_alerts_open": sum(1 for k in pagerduty.alerts if _open(pagerduty, k)),
        "pagerduty_events": len(pagerduty.accepted()),
        "mail_incident_threads": len(roots),
        "mails": len(received),
        "cause_named_after_first_webhook_s": None if cause_seen is None else round(cause_seen - first_webhook, 1),
        "findable_worst_s": round(delays[-1], 1) if delays else None,
        "findable_median_s": round(statistics.median(delays), 1) if delays else None,
        "not_findable": sum(1 for d in delays if d == float("inf")),
        "findable_by_alertname_s": _by_alertname(seen),
        "slack_calls_after_first_webhook_s": [
            (
                call.method,
                round(call.at + time.time() - time.monotonic() - first_webhook, 1),
                str(call.args.get("thread_ts") or call.args.get("ts") or ""),
                str(call.args.get("text", ""))[:50],
            )
            for call in slack.calls
            if call.method.startswith(("chat.post", "chat.update", "files.completeUploadExternal"))
        ],
        "prometheus_queries": queries,
        "bot_metrics": metrics,
    }  # fmt: skip


def _by_alertname(seen: dict[Alert, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    """Each alertname's median and worst time from its alerts' arrival until findable in Slack."""
    delays: dict[str, list[float]] = {}
    for (alertname, _, _), (heard, found) in seen.items():
        delays.setdefault(alertname, []).append(found - heard)
    return {name: (round(statistics.median(d), 1), round(max(d), 1)) for name, d in sorted(delays.items())}


def _open(pagerduty: FakePagerDuty, dedup_key: str) -> bool:
    alert = pagerduty.current(dedup_key)
    return alert is not None and alert.status != "resolved"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=300)
    parser.add_argument("--row", type=int, default=50, help="hosts per row (row C's cooling fails)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--limit", type=float, default=240.0, help="seconds to wait for each phase")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2), flush=True)
    print(
        f"{result['slack_incident_cards']} incident cards in Slack ({result['slack_posts_of_the_rows_incident']} "
        f"posts in the row's incident), {result['pagerduty_incident_alerts']} PagerDuty incident alerts, "
        f"{result['mail_incident_threads']} mail threads; facility cooling named "
        f"{result['cause_named_after_first_webhook_s']} s after the first webhook; every alert findable within "
        f"{result['findable_worst_s']} s of its arrival (median {result['findable_median_s']} s); "
        f"{result['prometheus_queries']} Prometheus queries",
        flush=True,
    )


if __name__ == "__main__":
    main()

"""Fleet storm benchmark: N GPUs on H hosts cross the shipped GPUTempCritical rule at once (the spec's incident:
1,200 GPUs on 150 hosts), and the worker enriches them all against a real Prometheus and the Loki fake.

A real Prometheus scrapes a synthetic dcgm-exporter serving every GPU of the fleet (too hot); the Loki fake holds
one kernel line per GPU. The alerts are stored as Alertmanager would send them (one notification per host,
labels as Prometheus gives them: the series' own labels, `instance`, `job`, `alertname`, `severity`, and the
rule's generatorURL) with the worker stopped; then `serve` of each checkout drains them (bench/ack.py's method:
timed from the first poll that sees the worker at work, once every notification is deduplicated). Printed per
checkout: enriched alerts/s, and the queries Prometheus (its own `prometheus_http_requests_total`) and the Loki
fake received for the whole storm, beside the issue's bound 2 x rules + templates x ceil(H / 50), and the stored
enrichment sections' statuses.

`--history 30m` first writes that much of every GPU's series into Prometheus (promtool); `--slack` times instead
how long until every alert is visible in the Slack fake (1 post/s) after the first webhook,
the notifications posted to one `serve`.

    .venv/bin/python -m bench.fleet [--alerts 1200] [--hosts 150] [--before DIR] [--after DIR] [--history 30m]
        [--slack] [--drain-limit 180]

It prints figures; it asserts nothing. The machine's load from other processes counts in them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sqlite3
import tempfile
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.ack import in_thread
from bench.common import (
    GO_ZERO_TIME,
    REPO,
    Checkout,
    StoreReader,
    pending_counts,
    serve,
    slack_bot_config,
)
from bench.slackview import until, visible
from bot.config.duration import parse_duration
from tests.fakes.loki import FakeLoki
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.exporter import (
    DCGM_GPU_TEMP,
    DCGM_POWER_USAGE,
    DCGM_SM_CLOCK,
    SyntheticExporter,
    dcgm_labels,
    scrape_config,
)
from tests.support.processes import Prometheus, backfill, wait_scraped

TEMP_URL = "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_GPU_TEMP+%3E+87&g0.tab=1"
RULES = {"groups": [{"name": "gpu", "rules": [{"alert": "GPUTempCritical", "expr": "DCGM_FI_DEV_GPU_TEMP > 87"}]}]}
# The shipped GPUTempCritical playbook's related queries, and the GPU inventory.
TEMPLATES = 5 + 1
HOSTS_PER_QUERY = 50
_POLL = 0.02
_START_TIMEOUT = 60.0


def host_name(n: int) -> str:
    return f"gpu-node-{n:03d}"


def labels(host: int, gpu: int) -> dict[str, str]:
    """A GPU's series labels as Prometheus stores them: dcgm-exporter's, and its host's exporter `instance`."""
    return {**dcgm_labels(gpu, hostname=host_name(host)), "instance": f"{host_name(host)}:9400"}


def alert(host: int, gpu: int, starts_at: str) -> dict[str, Any]:
    """One GPU's GPUTempCritical alert as Alertmanager sends it."""
    return {
        "status": "firing",
        "labels": {"alertname": "GPUTempCritical", "severity": "critical", "job": "dcgm", **labels(host, gpu)},
        "annotations": {"summary": f"GPU {gpu} on {host_name(host)} is above 87 °C"},
        "startsAt": starts_at,
        "endsAt": GO_ZERO_TIME,
        "generatorURL": TEMP_URL,
        "fingerprint": f"{host:04d}{gpu:04d}",
    }


def notification(host: int, gpus: int, starts_at: str) -> bytes:
    alerts = [alert(host, gpu, starts_at) for gpu in range(gpus)]
    payload = {
        "receiver": "gpu-alert-bot",
        "status": "firing",
        "alerts": alerts,
        "groupLabels": {"Hostname": host_name(host)},
        "commonLabels": {"alertname": "GPUTempCritical", "Hostname": host_name(host)},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": f'{{}}:{{Hostname="{host_name(host)}"}}',
        "truncatedAlerts": 0,
    }
    return json.dumps(payload).encode()


async def post_all(url: str, bodies: list[bytes]) -> None:
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"webhook: HTTP {response.status}")


def gpu_values(gpu: int) -> dict[str, float]:
    return {DCGM_GPU_TEMP: 90.0 + gpu, DCGM_POWER_USAGE: 600.0, DCGM_SM_CLOCK: 1200.0}


@contextmanager
def sources(hosts: int, gpus: int, starts_at: datetime, history: float = 0.0) -> Iterator[tuple[Prometheus, FakeLoki]]:
    """The real Prometheus (scraping the fleet, with the rule) and the Loki fake. `history`: seconds of samples
    (every 15 s) written into Prometheus's TSDB before it starts, up to a few seconds before `starts_at`."""
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-fleet-") as tmp, SyntheticExporter() as exporter:
        for n in range(hosts):
            for gpu in range(gpus):
                exporter.set_gpu(labels(n, gpu), gpu_values(gpu))
        if history:
            _backfill(Path(tmp), hosts, gpus, starts_at.timestamp(), history)
        rules = Path(tmp) / "rules.yml"
        rules.write_text(yaml.safe_dump(RULES))
        config = scrape_config(exporter.target, interval="2s")
        # Each host's series keep the `instance` the exporter gives them, as if every host ran its own exporter.
        config["scrape_configs"][0]["honor_labels"] = True
        prometheus = Prometheus(Path(tmp), config, [rules])
        try:
            wait_scraped(prometheus.url, DCGM_GPU_TEMP, hosts * gpus)
            loki = FakeLoki()
            for n in range(hosts):
                for gpu in range(gpus):
                    line = f"NVRM: GPU at PCI:0000:{0x18 + gpu:02x}:00: GPU-{n:04d}{gpu:04d}"
                    loki.push({"job": "syslog", "host": host_name(n)}, line, starts_at - timedelta(seconds=5))
            with in_thread(loki):
                yield prometheus, loki
        finally:
            prometheus.stop()


def _backfill(workdir: Path, hosts: int, gpus: int, now: float, history: float) -> None:
    """The fleet's series as the scrape will label them (`job` too), `history` seconds back, with promtool."""
    series: dict[str, float] = {}
    for n in range(hosts):
        for gpu in range(gpus):
            text = ",".join(f'{k}="{v}"' for k, v in {**labels(n, gpu), "job": "dcgm"}.items())
            series.update({f"{name}{{{text}}}": value for name, value in gpu_values(gpu).items()})
    started = time.perf_counter()
    backfill(workdir, series, start=now - history, end=now - 5)
    print(f"backfilled {len(series)} series over {history:g} s in {time.perf_counter() - started:.1f} s", flush=True)


def drain(db: Path, stored: int, limit: float, per_notification: int) -> dict[str, Any]:
    """From the first poll that sees the worker at work (dedup included: the storm's notifications are its work
    too) until no notification or event is pending, or `limit` seconds passed."""
    with StoreReader(db) as store:
        # Not the pending total: the worker's dedup leaves it unchanged (notifications become as many events), and
        # a storm routed in one batch takes it from all to none at once.
        idle = _work(store.pending())
        give_up = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < give_up and _work(store.pending()) == idle:
            time.sleep(_POLL)
        started = time.perf_counter()
        pending = _pending(store.pending(), per_notification)
        while pending and time.perf_counter() - started < limit:
            time.sleep(_POLL)
            pending = _pending(store.pending(), per_notification)
        elapsed = time.perf_counter() - started
    done = stored - pending
    return {"stored": stored, "processed": done, "seconds": round(elapsed, 2), "alerts_per_s": done / elapsed}


def _work(counts: dict[str, int]) -> tuple[int, int]:
    return counts["notifications_pending"], counts["events_pending"]


def _pending(counts: dict[str, int], per_notification: int) -> int:
    return counts["notifications_pending"] * per_notification + counts["events_pending"]


def prometheus_requests(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:  # noqa: S310 (loopback)
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "prometheus_http_requests":
            total += sum(
                s.value for s in family.samples if s.name.endswith("_total") and s.labels["handler"].startswith("/api/")
            )
    return int(total)


def enrichment_settings(prometheus: Prometheus, loki: FakeLoki) -> dict[str, Any]:
    return {"prometheus": {"url": prometheus.url}, "loki": {"url": loki.url}}


def queries_received(prometheus: Prometheus, loki: FakeLoki) -> tuple[int, int]:
    return prometheus_requests(prometheus.url), len(loki.range_queries)


def section_statuses(db: Path) -> dict[str, int]:
    """How many of the stored alerts' enrichment sections have each status (and reason), by section."""
    counts: Counter[str] = Counter()
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        for (stored,) in conn.execute("SELECT enrichment FROM alerts WHERE enrichment IS NOT NULL"):
            for section in json.loads(stored).get("sections", []):
                why = f": {section.get('reason') or ''}"[:80] if section["status"] == "unavailable" else ""
                counts[f"{section['name']} {section['status']}{why}"] += 1
    return dict(sorted(counts.items()))


def figure(checkout: Checkout, args: argparse.Namespace, prometheus: Prometheus, loki: FakeLoki) -> dict[str, Any]:
    gpus = args.alerts // args.hosts
    starts_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    bodies = [notification(n, gpus, starts_at) for n in range(args.hosts)]
    settings = {"enrichment": enrichment_settings(prometheus, loki)}
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-fleet-") as tmp:
        workdir = Path(tmp)
        options: tuple[str, ...] = ("--role", "ingest") if checkout.serve_roles else ()
        with serve(workdir, settings, *options, checkout=checkout) as (url, _process):
            asyncio.run(post_all(f"{url}/alertmanager", bodies))
        counts = pending_counts(workdir / "bot.db")
        stored = counts["notifications_pending"] * gpus + counts["events_pending"]
        asked = queries_received(prometheus, loki)
        with serve(workdir, settings, checkout=checkout):
            result = drain(workdir / "bot.db", stored, args.drain_limit, gpus)
        received = queries_received(prometheus, loki)
        result["sections"] = section_statuses(workdir / "bot.db")
    return _with_queries(result, asked, received, args.hosts)


async def slack_figure(
    checkout: Checkout, args: argparse.Namespace, prometheus: Prometheus, loki: FakeLoki
) -> dict[str, Any]:
    """The storm posted to one `serve` (the Slack fake at 1 post/s), timed from the first
    webhook until every alert is visible in Slack."""
    gpus = args.alerts // args.hosts
    starts_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    bodies = [notification(n, gpus, starts_at) for n in range(args.hosts)]
    async with FakeSlack() as slack:
        slack.enforce_rate(1.0)
        with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-fleet-") as tmp:
            workdir = Path(tmp)
            config = slack_bot_config(workdir, slack.api_url, DEFAULT_TOKEN, "warning", messages_per_second=1.0)
            settings = {**json.loads(config.read_text()), "enrichment": enrichment_settings(prometheus, loki)}
            with serve(workdir, settings, checkout=checkout) as (url, _process):
                asked = queries_received(prometheus, loki)
                started = time.monotonic()
                await post_all(f"{url}/alertmanager", bodies)
                posted = time.monotonic() - started
                seen: float | None = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.drain_limit):
                        seen = await until(lambda: len(visible(slack, "GPUTempCritical")) >= gpus * args.hosts)
            received = queries_received(prometheus, loki)
            result: dict[str, Any] = {
                "alerts": gpus * args.hosts,
                "webhooks_posted_in_s": round(posted, 2),
                "last_visible_after_s": None if seen is None else round(seen - started, 1),
                "visible": len(visible(slack, "GPUTempCritical")),
                "slack_posts": len([c for c in slack.calls_of("chat.postMessage") if c.ok]),
                "posted_after_s": [round(at - started, 1) for at in slack.post_times()],
                "slack_429": slack.rate_limited,
                "sections": section_statuses(workdir / "bot.db"),
            }
    return _with_queries(result, asked, received, args.hosts)


def _with_queries(
    result: dict[str, Any], asked: tuple[int, int], received: tuple[int, int], hosts: int
) -> dict[str, Any]:
    result["prometheus_queries"] = received[0] - asked[0]
    result["loki_queries"] = received[1] - asked[1]
    result["bound_prometheus"] = 2 * 1 + TEMPLATES * math.ceil(hosts / HOSTS_PER_QUERY)
    result["bound_loki"] = math.ceil(hosts / HOSTS_PER_QUERY)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=1200)
    parser.add_argument("--hosts", type=int, default=150)
    parser.add_argument("--before", type=Path, help="a checkout to measure first (e.g. the base commit)")
    parser.add_argument("--after", type=Path, default=REPO)
    parser.add_argument("--drain-limit", type=float, default=180.0)
    parser.add_argument("--history", type=parse_duration, default=0.0, help="samples written into Prometheus first")
    parser.add_argument("--slack", action="store_true", help="time until the last alert is visible in Slack")
    args = parser.parse_args()
    trees = [("before", Checkout(args.before))] if args.before else []
    trees.append(("after", Checkout(args.after)))
    started = datetime.now(UTC)
    with sources(args.hosts, args.alerts // args.hosts, started, args.history) as (prometheus, loki):
        for label, checkout in trees:
            if args.slack:
                result = asyncio.run(slack_figure(checkout, args, prometheus, loki))
                print(f"{label:<7} {json.dumps(result, default=str)}", flush=True)
                print(
                    f"{label:<7} {result['visible']} of {result['alerts']} alerts on {args.hosts} hosts visible in "
                    f"Slack, the last {result['last_visible_after_s']} s after the first webhook; Prometheus received "
                    f"{result['prometheus_queries']} queries, Loki {result['loki_queries']}",
                    flush=True,
                )
                continue
            result = figure(checkout, args, prometheus, loki)
            print(f"{label:<7} {json.dumps(result, default=str)}", flush=True)
            print(
                f"{label:<7} {result['processed']} alerts on {args.hosts} hosts: {result['alerts_per_s']:.0f} enriched "
                f"alerts/s; Prometheus received {result['prometheus_queries']} queries (bound "
                f"{result['bound_prometheus']}), Loki {result['loki_queries']} (bound {result['bound_loki']})",
                flush=True,
            )


if __name__ == "__main__":
    main()

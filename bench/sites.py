"""An incident spread over sites: N GPUs on H hosts cross GPUTempCritical together, the hosts split over `--sites`
sites (3 by default), each watched by its own real Prometheus (the first site by an HA pair) with an external
label `site`, which Alertmanager passes on in every alert. The bot is configured with `enrichment.prometheus.sites`
and `enrichment.loki.sites` (one Loki fake, a tenant per site). In the same run, the same incident on one site
(one Prometheus scraping every host, one Loki tenant) is measured first, for comparison.

Printed per run: enriched alerts/s (bench/fleet.py's method: stored by an ingest-only `serve`, then drained by
another), the queries each Prometheus received (its own `prometheus_http_requests_total`) and each Loki tenant,
and the stored sections' statuses. `--slack` times instead how long until every alert is visible in the Slack
fake (1 post/s, storm control on) after the first webhook. `--stop-replica` (with `--slack`) stops the replica of
the first site's pair that is asked first once half the webhooks are posted and it has answered a query of the
incident, then posts the other half, and prints how many of that site's alerts lost their Prometheus evidence
(goal 0).

    .venv/bin/python -m bench.sites [--alerts 2400] [--hosts 300] [--sites 3] [--history 30m] [--slack]
        [--stop-replica] [--drain-limit 180] [--budget 3s] [--source-timeout 2s]

It prints figures; it asserts nothing. The machine's load from other processes counts in them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.ack import in_thread
from bench.common import free_port, pending_counts, serve, slack_bot_config
from bench.fleet import (
    HOSTS_PER_QUERY,
    RULES,
    TEMPLATES,
    drain,
    gpu_values,
    host_name,
    labels,
    notification,
    post_all,
    prometheus_requests,
    section_statuses,
)
from bench.slackview import until, visible
from bot.config.duration import parse_duration
from tests.fakes.loki import FakeLoki
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.exporter import DCGM_GPU_TEMP, SyntheticExporter, scrape_config
from tests.support.processes import Prometheus, backfill, wait_scraped

ONE_SITE = "one"


@dataclass(frozen=True)
class Layout:
    """Which hosts each site holds, and the servers watching it (the first of a pair is asked first)."""

    sites: dict[str, range]
    servers: dict[str, list[Prometheus]]

    def site_of(self, host: int) -> str:
        return next(site for site, hosts in self.sites.items() if host in hosts)


def split(hosts: int, sites: int) -> dict[str, range]:
    names = [chr(ord("a") + n) for n in range(sites)]
    bounds = [hosts * n // sites for n in range(sites + 1)]
    return {name: range(bounds[n], bounds[n + 1]) for n, name in enumerate(names)}


def _server(
    workdir: Path, targets: list[str], site: str, hosts: range | list[int], gpus: int, history: float
) -> Prometheus:
    if history:
        series: dict[str, float] = {}
        for n in hosts:
            for gpu in range(gpus):
                text = ",".join(f'{k}="{v}"' for k, v in {**labels(n, gpu), "job": "dcgm"}.items())
                series.update({f"{name}{{{text}}}": value for name, value in gpu_values(gpu).items()})
        now = time.time()
        backfill(workdir, series, start=now - history, end=now - 5)
    rules = workdir / "rules.yml"
    workdir.mkdir(parents=True, exist_ok=True)
    rules.write_text(json.dumps(RULES))
    config = scrape_config(targets[0], interval="5s")
    config["scrape_configs"][0]["static_configs"] = [{"targets": targets}]
    config["scrape_configs"][0]["honor_labels"] = True  # each host's series keep their own `instance`
    config["global"]["external_labels"] = {"site": site}
    return Prometheus(workdir, config, [rules])


@contextmanager
def sources(
    hosts: int, gpus: int, sites: int, starts_at: datetime, history: float
) -> Iterator[tuple[Layout, Layout, FakeLoki]]:
    """The one-site layout, the per-site layout (the first site an HA pair), and the Loki fake holding one kernel
    line per GPU under its site's tenant and under the one site's."""
    parts = split(hosts, sites)
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-sites-") as tmp, ExitStack() as stack:
        exporters = {site: stack.enter_context(SyntheticExporter()) for site in parts}
        for site, part in parts.items():
            for n in part:
                for gpu in range(gpus):
                    exporters[site].set_gpu(labels(n, gpu), gpu_values(gpu))
        root = Path(tmp)
        every = [e.target for e in exporters.values()]
        servers: dict[str, list[Prometheus]] = {}
        one = [_server(root / ONE_SITE, every, ONE_SITE, range(hosts), gpus, history)]
        stack.callback(one[0].stop)
        for index, (site, part) in enumerate(parts.items()):
            replicas = 2 if index == 0 else 1
            servers[site] = []
            for replica in range(replicas):
                server = _server(root / f"{site}{replica}", [exporters[site].target], site, part, gpus, history)
                stack.callback(server.stop)
                servers[site].append(server)
        wait_scraped(one[0].url, DCGM_GPU_TEMP, hosts * gpus)
        for site, part in parts.items():
            for server in servers[site]:
                wait_scraped(server.url, DCGM_GPU_TEMP, len(part) * gpus)
        loki = FakeLoki(auth_enabled=True)
        for site, part in parts.items():
            for n in part:
                for gpu in range(gpus):
                    line = f"NVRM: GPU at PCI:0000:{0x18 + gpu:02x}:00: GPU-{n:04d}{gpu:04d}"
                    for tenant in (site, ONE_SITE):
                        at = starts_at - timedelta(seconds=5)
                        loki.push({"job": "syslog", "host": host_name(n)}, line, at, tenant=tenant)
        with in_thread(loki):
            yield Layout({ONE_SITE: range(hosts)}, {ONE_SITE: one}), Layout(parts, servers), loki


def enrichment_settings(layout: Layout, loki: FakeLoki, args: argparse.Namespace) -> dict[str, Any]:
    """`enrichment.budget` and every source's `timeout` from the command line (a busy machine needs more)."""
    timeout = args.source_timeout
    if list(layout.sites) == [ONE_SITE]:
        [server] = layout.servers[ONE_SITE]
        return {
            "budget": args.budget,
            "prometheus": {"url": server.url, "timeout": timeout},
            "loki": {"url": loki.url, "tenant_id": ONE_SITE, "timeout": timeout},
        }
    # The default source answers nothing: an alert enriched from it, not from its site's, says "unavailable".
    nowhere = f"http://127.0.0.1:{free_port()}"
    prometheus_sites = [
        {
            "name": site,
            "match": {"labels": {"site": site}},
            "url": servers[0].url,
            "replicas": [s.url for s in servers[1:]],
            "timeout": timeout,
        }
        for site, servers in layout.servers.items()
    ]
    loki_sites = [
        {"name": site, "match": {"labels": {"site": site}}, "url": loki.url, "tenant_id": site, "timeout": timeout}
        for site in layout.sites
    ]
    return {
        "budget": args.budget,
        "prometheus": {"url": nowhere, "sites": prometheus_sites, "timeout": timeout},
        "loki": {"url": loki.url, "tenant_id": "nobody", "sites": loki_sites, "timeout": timeout},
    }


def bodies(layout: Layout, gpus: int) -> list[bytes]:
    """One notification per host, each alert carrying its Prometheus' external label `site`; the sites' hosts
    take turns, as an incident on every site at once would send them."""
    starts_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    out = []
    for turn in itertools.zip_longest(*layout.sites.values()):
        for n in turn:
            if n is None:
                continue
            site = layout.site_of(n)
            payload = json.loads(notification(n, gpus, starts_at))
            for alert in payload["alerts"]:
                alert["labels"]["site"] = site
            payload["commonLabels"]["site"] = site
            out.append(json.dumps(payload).encode())
    return out


class Asked:
    """The queries each source received since it was made."""

    def __init__(self, layout: Layout, loki: FakeLoki) -> None:
        self._layout, self._loki = layout, loki
        self._last: Counter[str] = Counter()  # a replica stopped on purpose keeps the count it had then
        self._before = self._now()

    def _now(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for site, servers in self._layout.servers.items():
            for n, server in enumerate(servers):
                name = f"prometheus {site}{n if len(servers) > 1 else ''}"
                with contextlib.suppress(OSError):
                    self._last[name] = prometheus_requests(server.url)
                counts[name] = self._last[name]
        for query in self._loki.range_queries:
            counts[f"loki {query.org_id}"] += 1
        return counts

    def since(self) -> dict[str, int]:
        now = self._now()
        return {name: now[name] - self._before.get(name, 0) for name in sorted(now)}


def bound(hosts: int) -> dict[str, int]:
    """The query bound of one source's share of a stored incident on `hosts` hosts (one batch)."""
    return {"prometheus": 2 * 1 + TEMPLATES * math.ceil(hosts / HOSTS_PER_QUERY), "loki": math.ceil(hosts / 50)}


def lost_evidence(db: Path, site: str) -> dict[str, Any]:
    """Of `site`'s alerts: how many, how many of those told on their own lack their Prometheus evidence, and why
    (the budget spent on a busy machine is not the replica's doing: a stopped replica's alerts would name it). An
    alert told as a line of an incident asks for no evidence of its own: the incident's analysis is its evidence,
    and what that analysis could not gather is counted as `incident_problems`."""
    alerts = lines = 0
    why: Counter[str] = Counter()
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        as_lines = {key for (key,) in conn.execute("SELECT alert_key FROM incident_members WHERE alone = 0")}
        for key, labels_text, stored in conn.execute("SELECT key, labels, enrichment FROM alerts"):
            if json.loads(labels_text).get("site") != site:
                continue
            alerts += 1
            if key in as_lines:
                lines += 1
                continue
            sections = json.loads(stored or "{}").get("sections", [])
            prometheus = [s for s in sections if s["name"] == "prometheus"]
            if not prometheus or prometheus[0]["status"] != "ok":
                why[prometheus[0].get("reason") or prometheus[0]["status"] if prometheus else "no section"] += 1
        problems = [
            problem
            for (analysis,) in conn.execute("SELECT analysis FROM incidents WHERE analysis IS NOT NULL")
            for problem in json.loads(analysis).get("problems", [])
        ]
    return {
        "alerts": alerts,
        "told_as_incident_lines": lines,
        "without_prometheus_evidence": sum(why.values()),
        "why": dict(why),
        "incident_problems": problems,
    }


def throughput(layout: Layout, loki: FakeLoki, args: argparse.Namespace) -> dict[str, Any]:
    gpus = args.alerts // args.hosts
    settings = {"enrichment": enrichment_settings(layout, loki, args)}
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-sites-") as tmp:
        workdir = Path(tmp)
        with serve(workdir, settings, "--role", "ingest") as (url, _process):
            asyncio.run(post_all(f"{url}/alertmanager", bodies(layout, gpus)))
        counts = pending_counts(workdir / "bot.db")
        stored = counts["notifications_pending"] * gpus + counts["events_pending"]
        asked = Asked(layout, loki)
        with serve(workdir, settings):
            result = drain(workdir / "bot.db", stored, args.drain_limit, gpus)
        if result["processed"] < stored:  # what the bot said about it
            result["stderr_tail"] = (workdir / "stderr.log").read_text().splitlines()[-5:]
        result["queries"] = asked.since()
        result["sections"] = section_statuses(workdir / "bot.db")
    return result


async def to_slack(layout: Layout, loki: FakeLoki, args: argparse.Namespace, stop: Prometheus | None) -> dict[str, Any]:
    gpus = args.alerts // args.hosts
    notifications = bodies(layout, gpus)
    half = len(notifications) // 2
    async with FakeSlack() as slack:
        slack.enforce_rate(1.0)
        with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-sites-") as tmp:
            workdir = Path(tmp)
            config = slack_bot_config(workdir, slack.api_url, DEFAULT_TOKEN, "warning", messages_per_second=1.0)
            settings = {**json.loads(config.read_text()), "enrichment": enrichment_settings(layout, loki, args)}
            with serve(workdir, settings) as (url, _process):
                asked = Asked(layout, loki)
                started = time.monotonic()
                before = prometheus_requests(stop.url) if stop is not None else 0
                await post_all(f"{url}/alertmanager", notifications[:half])
                if stop is not None:
                    with contextlib.suppress(TimeoutError):  # until it has answered this incident (it is asked first)
                        async with asyncio.timeout(60):
                            await until(lambda: prometheus_requests(stop.url) > before)
                    asked.since()  # what the replica had answered until it stops
                    await asyncio.to_thread(stop.stop)
                await post_all(f"{url}/alertmanager", notifications[half:])
                posted = time.monotonic() - started
                seen: float | None = None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.drain_limit):
                        seen = await until(lambda: len(visible(slack, "GPUTempCritical")) >= gpus * args.hosts)
            result: dict[str, Any] = {
                "alerts": gpus * args.hosts,
                "webhooks_posted_in_s": round(posted, 2),
                "last_visible_after_s": None if seen is None else round(seen - started, 1),
                "visible": len(visible(slack, "GPUTempCritical")),
                "slack_posts": len([c for c in slack.calls_of("chat.postMessage") if c.ok]),
                "slack_429": slack.rate_limited,
                "queries": asked.since(),
                "sections": section_statuses(workdir / "bot.db"),
            }
            if stop is not None:
                result["stopped_replica_site"] = lost_evidence(workdir / "bot.db", next(iter(layout.sites)))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alerts", type=int, default=2400)
    parser.add_argument("--hosts", type=int, default=300)
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--drain-limit", type=float, default=180.0)
    parser.add_argument("--history", type=parse_duration, default=0.0, help="samples written into Prometheus first")
    parser.add_argument("--budget", type=parse_duration, default=3.0, help="enrichment.budget (a busy machine)")
    parser.add_argument("--source-timeout", type=parse_duration, default=2.0, help="each source's timeout")
    parser.add_argument("--slack", action="store_true", help="time until the last alert is visible in Slack")
    parser.add_argument("--stop-replica", action="store_true", help="with --slack: stop one replica of the pair")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    gpus = args.alerts // args.hosts
    with sources(args.hosts, gpus, args.sites, datetime.now(UTC), args.history) as (one, many, loki):
        for name, layout in (("one site", one), (f"{args.sites} sites", many)):
            per_site = {site: len(part) for site, part in layout.sites.items()}
            if args.slack:
                first = layout.servers[next(iter(layout.sites))]
                stop = first[0] if args.stop_replica and len(first) > 1 else None
                result = asyncio.run(to_slack(layout, loki, args, stop))
                summary = (
                    f"{result['visible']} of {result['alerts']} alerts visible in Slack, the last "
                    f"{result['last_visible_after_s']} s after the first webhook"
                )
            else:
                result = throughput(layout, loki, args)
                summary = f"{result['processed']} alerts, {result['alerts_per_s']:.0f} enriched alerts/s"
            result["bound_per_source"] = {site: bound(hosts) for site, hosts in per_site.items()}
            print(f"{name:<8} {json.dumps(result, default=str)}", flush=True)
            print(f"{name:<8} {summary}; queries per source {result['queries']}", flush=True)
            if "stopped_replica_site" in result:
                print(f"{name:<8} replica stopped mid-incident: {result['stopped_replica_site']}", flush=True)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()

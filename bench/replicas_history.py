"""`python -m bench.replicas --new-alerts`: new GPU alerts at a steady rate on replicas sharing one PostgreSQL, and
whether every alert got its GPU history ("History of this GPU", the recurrence enricher) within the budget.

The client is open-loop (each webhook leaves at its time whatever the replicas do) and alternates replicas as a
load balancer would. Each webhook is one new alert on one of `--gpus` GPUs (8 a host, with the `gpu`, `UUID` and
`pci_bus_id` labels dcgm-exporter gives, and the Xid label), so a GPU's history grows over the run. While it runs,
PostgreSQL's sessions are sampled every 100 ms for lock waits. Once the workers are done, it prints the stored
alerts' GPU history sections by status and reason, and, from the workers' /metrics summed, the time each alert's
GPU history took in the store (its wait for the batch's turn included) and the recurrence enricher's whole time
(its wait for the Xid section included), as p50/p99 interpolated within the histograms' buckets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import psycopg

from bench.common import GO_ZERO_TIME, free_port
from tests.support.postgres import PostgresServer

Replica = Callable[..., AbstractContextManager[str]]
_HISTORY = "gpu_alert_bot_gpu_history_duration_seconds"
_ENRICHER = "gpu_alert_bot_enrichment_duration_seconds"


def gpu_alert(n: int, gpu: int) -> bytes:
    """The nth alert of the run (new: its own fingerprint and start), on GPU number `gpu` of the fleet."""
    host, index = f"gpu-node-{gpu // 8:04d}", gpu % 8
    labels = {
        "alertname": "GPUXidError",
        "Hostname": host,
        "gpu": str(index),
        "UUID": f"GPU-{gpu:08x}-0000-4000-8000-000000000000",
        "pci_bus_id": f"00000000:{0x18 + 0x10 * index:02X}:00.0",
        "xid": "79",
        "severity": "critical",
    }
    alert = {
        "status": "firing",
        "labels": labels,
        "annotations": {"summary": f"Xid 79 on {host} GPU {index}"},
        "startsAt": datetime.now(UTC).isoformat(),
        "endsAt": GO_ZERO_TIME,
        "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0",
        "fingerprint": f"{n:016x}",
    }
    payload = {
        "receiver": "gpu-alert-bot",
        "status": "firing",
        "alerts": [alert],
        "groupLabels": {"n": str(n)},
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": f'{{}}:{{n="{n}"}}',
        "truncatedAlerts": 0,
    }
    return json.dumps(payload).encode()


async def _open_loop(urls: list[str], rate: float, duration: float, gpus: int) -> Counter[str]:
    outcomes: Counter[str] = Counter()

    async def post(session: aiohttp.ClientSession, n: int) -> None:
        try:
            async with session.post(
                f"{urls[n % len(urls)]}/alertmanager",
                data=gpu_alert(n, (n * 7919) % gpus),
                headers={"Content-Type": "application/json"},
            ) as response:
                await response.read()
                outcomes[str(response.status)] += 1
        except aiohttp.ClientError as exc:
            outcomes[type(exc).__name__] += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        tasks = []
        for n in range(round(rate * duration)):
            await asyncio.sleep(max(0.0, started + n / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(post(session, n)))
        await asyncio.gather(*tasks)
    return outcomes


class LockSampler:
    """PostgreSQL's sessions waiting on a lock, sampled every 100 ms: how many samples saw one, and on what."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._stop = threading.Event()
        self.samples = 0
        self.waiting = 0
        self.queries: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._stop.wait(0.1):
                rows = conn.execute(
                    "SELECT query FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                ).fetchall()
                self.samples += 1
                self.waiting += bool(rows)
                self.queries.update(" ".join(str(query).split())[:70] for (query,) in rows)


def _pending(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM notifications WHERE state = 'pending') "
            "+ (SELECT count(*) FROM events WHERE state = 'pending')"
        ).fetchone()
    return int(row[0]) if row else 0


def _history_sections(dsn: str) -> tuple[int, Counter[str]]:
    """(alerts stored, their GPU history sections by status and reason)."""
    found: Counter[str] = Counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT enrichment FROM alerts").fetchall()
    for (enrichment,) in rows:
        sections = {s["name"]: s for s in json.loads(enrichment)["sections"]} if enrichment else {}
        section = sections.get("recurrence")
        if section is None:
            found["not enriched"] += 1
        else:
            found[section["status"] + (f": {section['reason']}" if section.get("reason") else "")] += 1
    return len(rows), found


def _buckets(text: str, name: str, selector: str) -> Counter[float]:
    """Cumulative counts by upper bound of one histogram of a /metrics page."""
    found: Counter[float] = Counter()
    pattern = re.compile(rf"^{name}_bucket\{{(?P<labels>[^}}]*)\}} (?P<count>\S+)$", re.MULTILINE)
    for match in pattern.finditer(text):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        if selector in (f"{k}={v}" for k, v in labels.items()) or not selector:
            found[float(labels["le"])] += float(match["count"])
    return found


def quantile(buckets: Counter[float], q: float) -> float:
    """histogram_quantile's estimate: linear within the bucket holding the rank."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] == 0:
        return float("nan")
    rank, lower, below = q * buckets[bounds[-1]], 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-9)
        lower, below = bound, buckets[bound]
    return lower


def _metrics(ports: list[int]) -> str:
    pages = []
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            pages.append(response.read().decode())
    return "\n".join(pages)


def _figure(buckets: Counter[float]) -> str:
    count = int(max(buckets.values(), default=0))
    return f"p50 {quantile(buckets, 0.5) * 1000:.0f} ms, p99 {quantile(buckets, 0.99) * 1000:.0f} ms ({count})"


def _replicas(
    stack: ExitStack, replica: Replica, workdir: Path, dsn_file: Path, count: int
) -> Iterator[tuple[str, int]]:
    for n in range(count):
        port = free_port()
        store = {"backend": "postgresql", "dsn_file": str(dsn_file), "replica": f"r{n}"}
        worker = {"metrics_listen": f"127.0.0.1:{port}"}
        yield stack.enter_context(replica(workdir / f"replica{n}", store, worker=worker)), port


def run_new_alerts(args: argparse.Namespace, replica: Replica) -> None:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-replicas-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        server = PostgresServer()
        stack.callback(server.close)
        dsn = server.create_database()
        (workdir / "dsn").write_text(dsn)
        replicas = list(_replicas(stack, replica, workdir, workdir / "dsn", args.replicas))
        with LockSampler(dsn) as locks:
            outcomes = asyncio.run(_open_loop([url for url, _ in replicas], args.rate, args.duration, args.gpus))
            deadline = time.monotonic() + args.drain_limit
            while (pending := _pending(dsn)) and time.monotonic() < deadline:
                time.sleep(0.5)
        load_after = os.getloadavg()
        alerts, sections = _history_sections(dsn)
        page = _metrics([port for _, port in replicas])
    print(
        f"{args.replicas} replica(s) on PostgreSQL, {args.rate:g} new alerts/s for {args.duration:g} s over "
        f"{args.gpus} GPUs; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after",
        flush=True,
    )
    print(f"  webhooks answered: {dict(outcomes)}; still pending after the drain: {pending}")
    print(f"  GPU history of {alerts} stored alerts:")
    for what, n in sections.most_common():
        print(f"    {n:6d}  {what}")
    print(f"  GPU history in the store: {_figure(_buckets(page, _HISTORY, ''))}")
    print(f"  recurrence enricher, whole: {_figure(_buckets(page, _ENRICHER, 'enricher=recurrence'))}")
    print(f"  lock waits: {locks.waiting} of {locks.samples} samples")
    for query, n in locks.queries.most_common(5):
        print(f"    {n:6d}  {query}")

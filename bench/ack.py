"""Issue 14's figures for one source checkout, or two side by side, in one run beside the bare aiohttp handler.

    .venv/bin/python -m bench.ack --source DIR
    .venv/bin/python -m bench.ack --before DIR --after DIR [--only ack,saturated,worker,enriched,memory]

Each checkout's own `gpu-alert-bot serve` runs (its `.venv` when it has one, else this interpreter with the
checkout first on the path), on a fresh SQLite store per run, its console output discarded. With two checkouts
every figure is taken for both, one right after the other (the order alternating from figure to figure), so the
machine's load drifts over each pair alike. The load always comes from another process. Figures:

1. time to acknowledge, p50/p99, at each `--rates` (20-alert notifications, every alert new, open-loop client
   counting from each request's scheduled time, `--warmup` seconds left out) while the worker drains what the
   load brings, and the work still pending at the end;
2. saturated ingest, webhooks/s with `--connections` connections (wrk when installed);
3. worker alerts/s: `--preload` notifications stored with the worker stopped, then the worker started and its
   pending work (from the store's counts), once deduplicated, timed down to zero or for `--drain-limit` seconds;
   with enrichment off, then on against the Loki fake (tests/fakes/) and a real Prometheus scraping a synthetic
   DCGM exporter, both started here;
4. resident memory with `--alerts` alerts, summed over all the bot's processes (bench/memory.py's method).

It ends with a markdown table for README. It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import memory
from bench.common import (
    ALERTS_PER_WEBHOOK,
    STARTS_AT,
    Checkout,
    StoreReader,
    bot_process,
    pending_counts,
    post_webhooks,
    serve,
)
from bench.ingest import bare_server, saturate
from bench.openloop import fixed_rate
from tests.fakes.loki import FakeLoki
from tests.support.exporter import DCGM_GPU_TEMP, DCGM_XID_ERRORS, SyntheticExporter, dcgm_labels, scrape_config
from tests.support.processes import Prometheus, wait_scraped

FIGURES = ("ack", "saturated", "worker", "enriched", "memory")
ACK_GOALS = {200.0: "p99 < 5 ms", 1000.0: "p99 < 10 ms"}
_POLL = 0.05
_WORKER_START_TIMEOUT = 60.0


@dataclass
class Tree:
    label: str
    checkout: Checkout
    results: dict[str, dict[str, Any]] = field(default_factory=dict)


# --- the figures, each for one checkout -------------------------------------------------------------------------
def ack_figure(checkout: Checkout, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    with bot_process(checkout=checkout) as (url, _process, workdir):
        result = fixed_rate(f"{url}/alertmanager", rate, args.duration, args.warmup)
        return {**result, "backlog": pending_counts(workdir / "bot.db")}


def saturated_figure(checkout: Checkout, args: argparse.Namespace) -> dict[str, Any]:
    with bot_process(checkout=checkout) as (url, _process, workdir):
        result = saturate(f"{url}/alertmanager", args.connections, args.duration)
        return {**result, "backlog": pending_counts(workdir / "bot.db")}


def worker_figure(
    checkout: Checkout, notifications: int, limit: float, settings: dict[str, Any], starts_at: str = STARTS_AT
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-bench-") as tmp:
        workdir = Path(tmp)
        stored = _preload(checkout, workdir, notifications, settings, starts_at)
        with serve(workdir, settings, checkout=checkout):
            return _time_drain(workdir / "bot.db", stored, limit)


def _preload(checkout: Checkout, workdir: Path, notifications: int, settings: dict[str, Any], starts_at: str) -> int:
    """Stores the notifications and stops the bot; returns the alerts whose work is left for the worker."""
    if checkout.serve_roles:
        options: tuple[str, ...] = ("--role", "ingest")
        preload_settings = settings
    else:
        # The worker runs beside the ingest and does some of the work meanwhile: short leases free the events
        # it holds when stopped at once, rather than after the default minute, for the worker timed next.
        options = ()
        preload_settings = {**settings, "worker": {"event_lease": "1s"}}
    with serve(workdir, preload_settings, *options, checkout=checkout) as (url, _process):
        asyncio.run(post_webhooks(f"{url}/alertmanager", notifications, tag="e", starts_at=starts_at))
    return _alerts_pending(pending_counts(workdir / "bot.db"))


def _alerts_pending(counts: dict[str, int]) -> int:
    """Alerts the worker has yet to take through the pipeline: each stored notification holds 20 new ones."""
    return counts["notifications_pending"] * ALERTS_PER_WEBHOOK + counts["events_pending"]


def _time_drain(db: Path, stored: int, limit: float) -> dict[str, Any]:
    """From the first poll that sees the worker at work (its pending work down from what was stored) with every
    notification deduplicated, until nothing is pending or `limit` seconds passed. The start-up of its process is
    not counted, nor its dedup: a checkout without roles dedups while it is preloaded, one with roles after."""
    with StoreReader(db) as store:
        give_up = time.monotonic() + _WORKER_START_TIMEOUT
        while time.monotonic() < give_up:
            counts = store.pending()
            start_pending = _alerts_pending(counts)
            if start_pending < stored and not counts["notifications_pending"]:
                break
            time.sleep(_POLL)
        started = time.perf_counter()
        pending = start_pending
        while pending and time.perf_counter() - started < limit:
            time.sleep(_POLL)
            pending = _alerts_pending(store.pending())
        elapsed = time.perf_counter() - started
        left = store.pending()
    done = start_pending - pending
    return {
        "stored": stored,
        "timed": start_pending,
        "processed": done,
        "seconds": elapsed,
        "alerts_per_s": done / elapsed if elapsed > 0 and done else float("nan"),
        "left": left,
    }


# --- enrichment sources --------------------------------------------------------------------------------------
@contextmanager
def in_thread(server: FakeLoki) -> Iterator[FakeLoki]:
    """A loopback fake on an event loop of its own, in a thread of this process."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake", daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextmanager
def enrichment_sources(hosts: int, starts_at: datetime) -> Iterator[dict[str, Any]]:
    """The Loki fake with one kernel Xid line per alert, and a real Prometheus scraping the DCGM series of every
    GPU of the preloaded hosts; yields the bot's `enrichment` settings."""
    host_names = [f"e{n:07d}" for n in range(hosts)]
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-bench-prom-") as tmp, SyntheticExporter() as exporter:
        for host in host_names:
            for gpu in range(ALERTS_PER_WEBHOOK):
                exporter.set(DCGM_XID_ERRORS, dcgm_labels(gpu, hostname=host), 79)
                exporter.set(DCGM_GPU_TEMP, dcgm_labels(gpu, hostname=host), 61)
        prometheus = Prometheus(Path(tmp), scrape_config(exporter.target, interval="2s"))
        try:
            wait_scraped(prometheus.url, DCGM_XID_ERRORS, len(host_names) * ALERTS_PER_WEBHOOK)
            loki = FakeLoki()
            for host in host_names:
                for gpu in range(ALERTS_PER_WEBHOOK):
                    loki.push({"job": "syslog", "host": host}, _xid_line(gpu), starts_at - timedelta(seconds=1))
            with in_thread(loki):
                yield {"loki": {"url": loki.url}, "prometheus": {"url": prometheus.url}}
        finally:
            prometheus.stop()


def _xid_line(gpu: int) -> str:
    return f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): 79, pid=2231, name=python3, GPU has fallen off the bus."


# --- the run -------------------------------------------------------------------------------------------------
def run_pair(trees: list[Tree], index: int, name: str, figure: Callable[[Checkout], dict[str, Any]]) -> None:
    """One figure for every checkout, back to back; every other pair starts with the second checkout."""
    for tree in trees if index % 2 == 0 else reversed(trees):
        result = figure(tree.checkout)
        tree.results[name] = result
        print(f"{name:<12} {tree.label:<7} {json.dumps(result, default=str)}", flush=True)


def bare_figures(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    url, process = bare_server()
    try:
        results = {
            f"ack{rate:g}": fixed_rate(f"{url}/alertmanager", rate, args.duration, args.warmup) for rate in args.rates
        }
        results["saturated"] = saturate(f"{url}/alertmanager", args.connections, args.duration)
    finally:
        process.terminate()
        process.wait()
    for name, result in results.items():
        print(f"{name:<12} bare    {json.dumps(result)}", flush=True)
    return results


def run(trees: list[Tree], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    bare = bare_figures(args) if {"ack", "saturated"} & set(args.only) else {}
    pairs: list[tuple[str, Callable[[Checkout], dict[str, Any]]]] = []
    if "ack" in args.only:
        pairs += [(f"ack{rate:g}", functools.partial(ack_figure, rate=rate, args=args)) for rate in args.rates]
    if "saturated" in args.only:
        pairs.append(("saturated", lambda c: saturated_figure(c, args)))
    if "worker" in args.only:
        pairs.append(("worker", lambda c: worker_figure(c, args.preload, args.drain_limit, {})))
    for index, (name, figure) in enumerate(pairs):
        run_pair(trees, index, name, figure)
    if "enriched" in args.only:
        starts_at = datetime.now(UTC).replace(microsecond=0)
        stamp = starts_at.isoformat().replace("+00:00", "Z")
        with enrichment_sources(args.enriched_preload, starts_at) as sources:
            settings = {"enrichment": sources}
            run_pair(
                trees,
                len(pairs),
                "enriched",
                lambda c: worker_figure(c, args.enriched_preload, args.drain_limit, settings, stamp),
            )
    if "memory" in args.only:
        run_pair(trees, len(pairs) + 1, "memory", lambda c: memory.measure(args.alerts, {}, args.memory_limit, c))
    return bare


# --- the table -----------------------------------------------------------------------------------------------
def table(trees: list[Tree], bare: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    header = ["figure", "bare aiohttp", *(tree.label for tree in trees), "goal"]
    rows: list[list[str]] = []

    def row(name: str, title: str, cell: Callable[[dict[str, Any]], str], goal: str, bare_cell: str = "") -> None:
        if any(name in tree.results for tree in trees):
            rows.append([title, bare_cell, *(cell(tree.results[name]) for tree in trees), goal])

    for rate in args.rates:
        name = f"ack{rate:g}"
        bare_cell = _latency(bare[name]) if name in bare else ""
        row(
            name,
            f"ack p50 / p99 at {rate:,.0f} webhooks/s, worker draining",
            _latency,
            ACK_GOALS.get(rate, ""),
            bare_cell,
        )
        row(name, f"pending at the end of the {rate:,.0f}/s run (notifications / events)", _backlog, "")
    bare_saturated = f"{bare['saturated']['rps']:,.0f}/s" if "saturated" in bare else ""
    row("saturated", f"saturated ingest, {args.connections} connections", _throughput, ">= 3,000/s", bare_saturated)
    row(
        "worker",
        f"worker, enrichment off ({args.preload * ALERTS_PER_WEBHOOK:,} alerts stored)",
        _drain,
        ">= 5,000 alerts/s",
    )
    row(
        "enriched",
        f"worker, Loki fake + Prometheus ({args.enriched_preload * ALERTS_PER_WEBHOOK:,} alerts stored)",
        _drain,
        "",
    )
    row("memory", f"RSS with {args.alerts:,} alerts, all processes summed (peak)", _memory, "< 150 MB")
    lines = [_markdown(header), _markdown(["---"] * len(header)), *map(_markdown, rows)]
    return "\n".join(lines)


def _markdown(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _failures(result: dict[str, Any]) -> str:
    return f" ({result['failures']} not 200)" if result.get("failures") else ""


def _latency(result: dict[str, Any]) -> str:
    return f"{result['p50_ms']:.2f} / {result['p99_ms']:.2f} ms{_failures(result)}"


def _backlog(result: dict[str, Any]) -> str:
    backlog = result["backlog"]
    return f"{backlog['notifications_pending']:,} / {backlog['events_pending']:,}"


def _throughput(result: dict[str, Any]) -> str:
    return f"{result['rps']:,.0f}/s, p99 {result['p99_ms']:.1f} ms{_failures(result)}"


def _drain(result: dict[str, Any]) -> str:
    drained = "all" if result["processed"] == result["timed"] else f"{result['processed']:,} of {result['timed']:,}"
    return f"{result['alerts_per_s']:,.0f} alerts/s ({drained} in {result['seconds']:.1f} s)"


def _memory(result: dict[str, Any]) -> str:
    pending = sum(v for k, v in result["counts"].items() if k.endswith("_pending"))
    state = "all processed" if not pending else f"{pending:,} still pending"
    return (
        f"{result['peak_mib']:.0f} MiB (at the end: {result['rss_mib']:.0f} MiB, PSS {result['pss_mib']:.0f} MiB; "
        f"{_processes(result['processes'])}; {state})"
    )


def _processes(count: int) -> str:
    return f"{count} process" if count == 1 else f"{count} processes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, help="the one checkout to measure")
    parser.add_argument("--before", type=Path, help="the checkout before the change")
    parser.add_argument("--after", type=Path, help="the checkout after the change")
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        default=list(FIGURES),
        help="figures, comma-separated: " + ",".join(FIGURES),
    )
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[200.0, 1000.0], help="webhooks/s of the ack runs (default 200 1000)"
    )
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds of each load run (default 8)")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of load sent first and not counted (default 2)"
    )
    parser.add_argument("--connections", type=int, default=32, help="connections of the saturated run (default 32)")
    parser.add_argument(
        "--preload", type=int, default=1000, help="notifications stored for the worker, enrichment off (default 1000)"
    )
    parser.add_argument(
        "--enriched-preload",
        type=int,
        default=100,
        help="notifications stored for the worker, enrichment on (default 100)",
    )
    parser.add_argument("--drain-limit", type=float, default=20.0, help="longest a worker is timed (s, default 20)")
    parser.add_argument("--alerts", type=int, default=100_000, help="alerts of the memory run (default 100000)")
    parser.add_argument(
        "--memory-limit", type=float, default=60.0, help="longest wait for the memory run's worker (s, default 60)"
    )
    args = parser.parse_args()
    if args.source is not None and args.before is None and args.after is None:
        trees = [Tree("source", Checkout(args.source.resolve()))]
    elif args.source is None and args.before is not None and args.after is not None:
        trees = [Tree("before", Checkout(args.before.resolve())), Tree("after", Checkout(args.after.resolve()))]
    else:
        parser.error("give --source DIR, or --before DIR and --after DIR")
    unknown = set(args.only) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figures: {', '.join(sorted(unknown))}")
    started = time.monotonic()
    bare = run(trees, args)
    print(f"\n{table(trees, bare, args)}\n\n(whole run {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()

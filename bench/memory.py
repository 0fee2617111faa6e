"""Memory benchmark: resident memory of a real `gpu-alert-bot serve` process holding 100,000 stored alerts.

    .venv/bin/python -m bench.memory [--alerts 100000]

Posts 20-alert notifications (every alert new) until the store holds the requested number of alerts, waits
until the worker has processed all of them (events routed, console deliveries written to /dev/null), then
reads VmRSS of all the bot's processes from /proc (summed: `serve` may start a worker process), sampled
every second meanwhile for the peak. It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ALERTS_PER_WEBHOOK,
    HARNESS,
    Checkout,
    bot_process,
    bot_pss_mib,
    bot_rss_mib,
    pending_counts,
    post_webhooks,
    store_counts,
)


def _wait_drained(db: Path, root: int, timeout: float) -> tuple[dict[str, int], float]:
    """Waits until nothing is pending or `timeout` passed; also returns the largest summed RSS seen meanwhile."""
    deadline = time.monotonic() + timeout
    peak = 0.0
    while True:
        peak = max(peak, bot_rss_mib(root)[0])
        counts = pending_counts(db)
        if sum(counts.values()) == 0 or time.monotonic() > deadline:
            return counts, peak
        time.sleep(1)


def measure(alerts: int, settings: dict[str, Any], timeout: float, checkout: Checkout = HARNESS) -> dict[str, Any]:
    """Post `alerts` new alerts to a fresh `serve` of `checkout`, wait for the worker, read the memory of all of
    the bot's processes."""
    webhooks = -(-alerts // ALERTS_PER_WEBHOOK)
    with bot_process(settings, checkout=checkout) as (url, process, workdir):
        idle, _ = bot_rss_mib(process.pid)
        started = time.monotonic()
        asyncio.run(post_webhooks(f"{url}/alertmanager", webhooks, tag="m"))
        ingested = time.monotonic() - started
        after_ingest, _ = bot_rss_mib(process.pid)
        pending, peak = _wait_drained(workdir / "bot.db", process.pid, timeout)
        drained = time.monotonic() - started
        rss, processes = bot_rss_mib(process.pid)
        pss = bot_pss_mib(process.pid)
        counts = {**store_counts(workdir / "bot.db"), **pending}
        db_mib = sum(p.stat().st_size for p in workdir.glob("bot.db*")) / 1024 / 1024
    return {
        "webhooks": webhooks,
        "ingest_s": ingested,
        "drained_s": drained,
        "counts": counts,
        "idle_mib": idle,
        "after_ingest_mib": after_ingest,
        "rss_mib": rss,
        "pss_mib": pss,
        "processes": processes,
        "peak_mib": max(peak, rss, after_ingest),
        "db_mib": db_mib,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=100_000, help="alerts to store (default 100000)")
    parser.add_argument("--playbooks", type=Path, help="playbook directory (default: the bundled playbooks)")
    parser.add_argument("--timeout", type=float, default=900, help="longest wait for the worker to drain (s)")
    args = parser.parse_args()
    settings = {"playbooks": {"dir": str(args.playbooks.resolve())}} if args.playbooks else {}
    result = measure(args.alerts, settings, args.timeout)
    counts = result["counts"]
    print(f"webhooks posted          {result['webhooks']} x {ALERTS_PER_WEBHOOK} alerts in {result['ingest_s']:.1f} s")
    print(f"alerts stored            {counts['alerts']}")
    print(f"still pending            {counts}")
    print(f"worker drained after     {result['drained_s']:.1f} s (or gave up waiting)")
    print(f"RSS idle                 {result['idle_mib']:.1f} MiB")
    print(f"RSS after ingest         {result['after_ingest_mib']:.1f} MiB")
    print(f"RSS after processing     {result['rss_mib']:.1f} MiB   (goal < 150 MB; {result['processes']} processes)")
    print(f"PSS after processing     {result['pss_mib']:.1f} MiB   (shared pages counted once)")
    print(f"RSS peak                 {result['peak_mib']:.1f} MiB   (largest sum seen, sampled every second)")
    print(f"store on disk            {result['db_mib']:.1f} MiB")


if __name__ == "__main__":
    main()

"""Memory benchmark: resident memory of a real `gpu-alert-bot serve` process holding 100,000 stored alerts.

    .venv/bin/python -m bench.memory [--alerts 100000]

Posts 20-alert notifications (every alert new) until the store holds the requested number of alerts, waits
until the worker has processed all of them (events routed, console deliveries written to /dev/null), then
reads VmRSS and VmHWM (peak) of the server from /proc. It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp

from bench.common import ALERTS_PER_WEBHOOK, bot_process, rss_mib, store_counts, webhook_body


async def _post_all(url: str, count: int, concurrency: int = 16) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            body = webhook_body(n, tag="m")
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"webhook {n}: HTTP {response.status}")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def _wait_drained(db: Path, timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        counts = store_counts(db)
        pending = counts["notifications_pending"] + counts["events_pending"] + counts["deliveries_pending"]
        if pending == 0 or time.monotonic() > deadline:
            return counts
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=100_000, help="alerts to store (default 100000)")
    parser.add_argument("--playbooks", type=Path, help="playbook directory (default: the bundled playbooks)")
    parser.add_argument("--timeout", type=float, default=900, help="longest wait for the worker to drain (s)")
    args = parser.parse_args()
    settings = {"playbooks": {"dir": str(args.playbooks.resolve())}} if args.playbooks else {}
    webhooks = -(-args.alerts // ALERTS_PER_WEBHOOK)
    with bot_process(settings) as (url, process, workdir):
        idle, _ = rss_mib(process.pid)
        started = time.monotonic()
        asyncio.run(_post_all(f"{url}/alertmanager", webhooks))
        ingested = time.monotonic() - started
        after_ingest, _ = rss_mib(process.pid)
        counts = _wait_drained(workdir / "bot.db", args.timeout)
        drained = time.monotonic() - started
        rss, peak = rss_mib(process.pid)
        db_mib = sum(p.stat().st_size for p in workdir.glob("bot.db*")) / 1024 / 1024
    print(f"webhooks posted          {webhooks} x {ALERTS_PER_WEBHOOK} alerts in {ingested:.1f} s")
    print(f"alerts stored            {counts['alerts']}")
    print(f"still pending            {counts}")
    print(f"worker drained after     {drained:.1f} s")
    print(f"RSS idle                 {idle:.1f} MiB")
    print(f"RSS after ingest         {after_ingest:.1f} MiB")
    print(f"RSS after processing     {rss:.1f} MiB   (goal < 150 MB)")
    print(f"RSS peak (VmHWM)         {peak:.1f} MiB")
    print(f"store on disk            {db_mib:.1f} MiB")


if __name__ == "__main__":
    main()

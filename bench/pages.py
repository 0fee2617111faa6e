"""The incident page of a 1,200-alert incident: first byte, time to the table in chromium, rows per page, and the
bot's memory while 10 pages follow the incident.

    .venv/bin/python -m bench.pages [--alerts 1200] [--samples 20] [--loads 5] [--viewers 10] [--follow 60]

A real `gpu-alert-bot serve` (SQLite store, pages on, open on loopback, refresh 5 s) is sent the incident as 20-alert
notifications of one alertname; once the worker has attributed every alert to the one incident:

1. **First byte** of `GET /pages/incidents/ID` (`--samples` requests, one connection each): from the request sent
   to its status line read. Also the JSON page of 100 rows the table asks for, whole.
2. **Time to the table** in Debian's chromium, headless (playwright with /usr/bin/chromium): from `goto` to the
   script marking the page ready (its first 100 rows shown), `--loads` times, each in a fresh context.
3. **Rows per page**: the rows the page shows, and the size of the JSON answer that brought them.
4. **Memory with `--viewers` open pages**: VmRSS of the bot's processes before the pages open, then sampled every
   second for `--follow` seconds while they stay open and follow the incident, 20 more alerts joining it every
   10 s (each page then fetches its summary and rows again), and after they close. The picture worker (the heat
   map, drawn in a process of its own once per version) is given apart.

It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import sqlite3
import statistics
import time
import urllib.request
from pathlib import Path

from bench.common import ALERTS_PER_WEBHOOK, bot_pids, bot_process, free_port, post_webhooks, rss_mib

CHROMIUM = "/usr/bin/chromium"
SETTINGS = {"server": {"pages": {"enabled": True, "refresh": "5s"}}}


def _incident(db: Path, alerts: int, timeout: float = 300) -> str:
    """The incident's id once it holds `alerts` alerts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT incident_id, COUNT(*) FROM incident_members GROUP BY incident_id").fetchall()
        if len(rows) == 1 and rows[0][1] >= alerts:
            return str(rows[0][0])
        time.sleep(0.5)
    raise TimeoutError(f"no incident of {alerts} alerts within {timeout} s")


def _first_byte(url: str) -> float:
    """Seconds from the request sent (on a new connection) to its status line read."""
    address = url.removeprefix("http://").split("/", 1)
    connection = http.client.HTTPConnection(address[0], timeout=30)
    try:
        connection.connect()
        started = time.perf_counter()
        connection.request("GET", "/" + address[1])
        response = connection.getresponse()
        taken = time.perf_counter() - started
        response.read()
        return taken
    finally:
        connection.close()


def _whole(url: str) -> tuple[float, bytes]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:  # noqa: S310 (loopback URL built here)
        body: bytes = answer.read()
    return time.perf_counter() - started, body


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    median = statistics.median(ordered)
    return f"median {median * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


def _memory(root: int) -> tuple[float, float]:
    """(the bot's processes, the picture worker) in MiB."""
    bot = pictures = 0.0
    for pid in bot_pids(root):
        try:
            rss = rss_mib(pid)[0]
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, KeyError):
            continue
        if b"multiprocessing" in command:
            pictures += rss
        else:
            bot += rss
    return bot, pictures


async def _browser_figures(page_url: str, loads: int, viewers: int, follow: float, root: int, alerts: str) -> None:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            shown: list[float] = []
            rows = 0
            for _ in range(loads):
                context = await browser.new_context()
                page = await context.new_page()
                started = time.perf_counter()
                await page.goto(page_url)
                await page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                shown.append(time.perf_counter() - started)
                rows = await page.locator("#rows tr").count()
                await context.close()
            print(f"time to the table in chromium ({loads} loads): {_ms(shown)}")
            print(f"rows per page: {rows}")

            before = _memory(root)
            contexts = [await browser.new_context() for _ in range(viewers)]
            for context in contexts:
                page = await context.new_page()
                await page.goto(page_url)
                await page.wait_for_selector("body[data-ready='1']", timeout=60_000)
            opened = _memory(root)
            peak = opened
            ends = time.monotonic() + follow
            joined = 0
            next_join = time.monotonic()
            while time.monotonic() < ends:
                if time.monotonic() >= next_join:
                    await post_webhooks(alerts, 1, tag=f"join{joined}")
                    joined += 1
                    next_join += 10
                now = _memory(root)
                peak = (max(peak[0], now[0]), max(peak[1], now[1]))
                await asyncio.sleep(1)
            following = _memory(root)
            for context in contexts:
                await context.close()
            await asyncio.sleep(2)
            after = _memory(root)
        finally:
            await browser.close()
    print(
        f"bot RSS, MiB (its processes; the picture worker apart): before the pages {before[0]:.0f} ({before[1]:.0f}), "
        f"{viewers} pages open {opened[0]:.0f} ({opened[1]:.0f}), peak while following {follow:.0f} s with "
        f"{joined * ALERTS_PER_WEBHOOK} alerts joining {peak[0]:.0f} ({peak[1]:.0f}), at the end {following[0]:.0f} "
        f"({following[1]:.0f}), pages closed {after[0]:.0f} ({after[1]:.0f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=1200)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--viewers", type=int, default=10)
    parser.add_argument("--follow", type=float, default=60.0)
    args = parser.parse_args()
    metrics = f"127.0.0.1:{free_port()}"  # the worker's /metrics: not webhook port + 1, which may be taken
    with bot_process(SETTINGS, "--worker-metrics-listen", metrics) as (url, process, workdir):
        asyncio.run(post_webhooks(f"{url}/alertmanager", -(-args.alerts // ALERTS_PER_WEBHOOK), tag="p"))
        incident_id = _incident(workdir / "bot.db", args.alerts)
        page_url = f"{url}/pages/incidents/{incident_id}"
        _first_byte(page_url)  # the first answer loads the templates: not counted
        print(f"incident {incident_id}: {args.alerts:,} alerts")
        first = [_first_byte(page_url) for _ in range(args.samples)]
        print(f"first byte of its page ({args.samples} requests): {_ms(first)}")
        taken = [_whole(f"{page_url}/alerts?sort=value&order=desc&page=1") for _ in range(args.samples)]
        size = len(taken[-1][1])
        shown = len(json.loads(taken[-1][1])["rows"])
        print(f"the table's page of {shown} rows, whole ({size / 1024:.0f} KiB): {_ms([t for t, _ in taken])}")
        page_html = _whole(page_url)[1]
        print(f"the page's HTML: {len(page_html) / 1024:.0f} KiB")
        asyncio.run(
            _browser_figures(page_url, args.loads, args.viewers, args.follow, process.pid, f"{url}/alertmanager")
        )


if __name__ == "__main__":
    main()

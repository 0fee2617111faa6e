"""Hostile clients against a real `gpu-alert-bot serve` process: how long they hold connections, whether the
bot stays reachable meanwhile, and what an endless enrichment answer costs in memory.

    .venv/bin/python -m bench.hostile [--connections 500] [--header-timeout 10s] [--idle-timeout 60s]

1. idle: `--connections` connections that send nothing; the longest any of them is kept open;
2. slowloris: as many connections that send one header byte a second, forever; the longest any is kept open;
3. during both, /healthz on a fresh connection every 100 ms: how many answered, and the slowest answer;
4. memory: three alerts for three hosts while Loki answers each query with an endless body; resident memory
   (VmRSS, and the peak VmHWM) of the server before and after the three messages went out.

It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

import httpx

from bench.common import bot_process, rss_mib, webhook_body
from tests.fakes.loki import FakeLoki

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n"


async def _held(port: int, trickle: bool, limit: float) -> float:
    """Seconds until the server closed a connection (capped at `limit`)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if trickle:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Slow: ")
        while time.monotonic() - started < limit:
            with contextlib.suppress(TimeoutError):
                if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                    break
            if trickle:
                writer.write(b"a")
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
        return time.monotonic() - started
    except ConnectionError:
        return time.monotonic() - started
    finally:
        writer.close()


async def _probe(port: int, stop: asyncio.Event) -> tuple[int, int, float]:
    """(attempts, answered, slowest answer in s) of /healthz on fresh connections until `stop`."""
    attempts = answered = 0
    slowest = 0.0
    while not stop.is_set():
        attempts += 1
        started = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
            writer.write(HEALTHZ)
            line = await asyncio.wait_for(reader.readline(), 5)
            writer.close()
            if b" 200 " in line:
                answered += 1
                slowest = max(slowest, time.monotonic() - started)
        except (OSError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    return attempts, answered, slowest


async def _attack(port: int, connections: int, trickle: bool, limit: float) -> None:
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe(port, stop))
    held = await asyncio.gather(*(_held(port, trickle, limit) for _ in range(connections)))
    stop.set()
    attempts, answered, slowest = await probe
    name = "slowloris" if trickle else "idle"
    median = sorted(held)[len(held) // 2]
    print(
        f"{name:9s}: {connections} connections, longest held {max(held):.1f} s (median {median:.1f} s); "
        f"/healthz answered {answered}/{attempts}, slowest {slowest * 1000:.0f} ms"
    )


async def _memory(loki: FakeLoki, budget: float) -> None:
    loki.oversized(None)
    settings = {"enrichment": {"budget": f"{budget}s", "loki": {"url": loki.url, "timeout": f"{budget - 1}s"}}}
    with bot_process(settings) as (url, process, _workdir):
        before, _ = rss_mib(process.pid)
        async with httpx.AsyncClient(timeout=30) as client:
            for n in range(3):
                answer = await client.post(
                    f"{url}/alertmanager",
                    content=webhook_body(n, tag="loki", alerts=1),
                    headers={"Content-Type": "application/json"},
                )
                answer.raise_for_status()
            # Each alert's Loki query ends at the cap, or at worst with the enrichment budget.
            await asyncio.sleep(budget + 2)
        after, peak = rss_mib(process.pid)
    print(
        f"memory   : endless Loki answers to {len(loki.range_queries)} queries (3 alerts): "
        f"RSS {before:.0f} -> {after:.0f} MiB (peak {peak:.0f} MiB)"
    )


async def run(args: argparse.Namespace) -> None:
    server = {"header_timeout": args.header_timeout, "idle_timeout": args.idle_timeout}
    with bot_process({"server": server}) as (url, _process, _workdir):
        port = int(url.rsplit(":", 1)[1])
        await _attack(port, args.connections, trickle=False, limit=args.limit)
        await _attack(port, args.connections, trickle=True, limit=args.limit)
    async with FakeLoki() as loki:
        await _memory(loki, budget=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=500, help="hostile connections per run (default 500)")
    parser.add_argument("--header-timeout", default="10s", help="server.header_timeout (default 10s)")
    parser.add_argument("--idle-timeout", default="60s", help="server.idle_timeout (default 60s)")
    parser.add_argument("--limit", type=float, default=120, help="give up on a connection after this long (s)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()

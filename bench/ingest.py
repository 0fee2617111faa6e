"""Ingest benchmark: webhooks per second and time to acknowledge, beside a bare aiohttp handler, same machine.

    .venv/bin/python -m bench.ingest [--duration 10] [--connections 32] [--rate 200]

Every request carries a 20-alert notification of its own group with all alerts new, so each acknowledge is a
durable write (group commit, fsync) and 20 events for the worker, which runs in the same process meanwhile.
The load comes from another process: wrk (Debian package `wrk`) for the saturation runs when installed, else
an aiohttp client; the open-loop client of bench/openloop.py for the fixed-rate run (latency counted from the
scheduled send time, so a stalled server cannot hide its queue). It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, bot_process, env_python, free_port, percentile, store_counts, wait_ready, webhook_body
from bench.openloop import fixed_rate

_WRK_SCRIPT = """
local template = io.open("{template}"):read("*a")
local counter = 0
local thread_id = 0
local next_id = 0
function setup(thread)
  next_id = next_id + 1
  thread:set("thread_id", next_id)
end
function request()
  counter = counter + 1
  local body = template:gsub("{marker}", string.format("w%d-%09d", thread_id, counter))
  return wrk.format("POST", "/alertmanager", {{["Content-Type"] = "application/json"}}, body)
end
"""
_MARKER = "WRKID0000000"
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


# --- roles run in their own processes -------------------------------------------------------------------------
def run_bare_server(port: int) -> None:
    """The reference: an aiohttp handler that reads the body and answers 200, nothing else."""
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "accepted"})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    app = web.Application(client_max_size=32 * 1024 * 1024)
    app.router.add_post("/alertmanager", handler)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


async def _closed_loop(url: str, connections: int, duration: float) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    failures = 0
    deadline = time.perf_counter() + duration
    counter = 0

    async def worker(session: aiohttp.ClientSession, worker_id: int) -> None:
        nonlocal failures, counter
        while time.perf_counter() < deadline:
            counter += 1
            body = webhook_body(counter, tag=f"c{worker_id}-")
            started = time.perf_counter()
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                failures += response.status != 200
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:
        await asyncio.gather(*(worker(session, n) for n in range(connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "requests": len(latencies),
        "failures": failures,
    }


# --- orchestration -------------------------------------------------------------------------------------------
def _client(role: str, url: str, *options: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "bench.ingest", "--role", role, "--url", url, *options]
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env_python(), cwd=REPO).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _wrk(url: str, connections: int, duration: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        template = Path(tmp) / "body.json"
        template.write_bytes(webhook_body(0, tag="WRKID"))
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_SCRIPT.format(template=template, marker=_MARKER))
        args = ["wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", "-s", str(script), url]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    latency = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": _ms(latency["50"]),
        "p99_ms": _ms(latency["99"]),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),  # type: ignore[union-attr]
        "failures": int(non_2xx.group(1)) if non_2xx else 0,
    }


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * _UNIT[unit]


def saturate(url: str, connections: int, duration: float) -> dict[str, Any]:
    if shutil.which("wrk"):
        return {**_wrk(url, connections, duration), "client": "wrk"}
    result = _client("load", url, "--connections", str(connections), "--duration", str(duration))
    return {**result, "client": "aiohttp"}


def bare_server() -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    args = [sys.executable, "-m", "bench.ingest", "--role", "bare", "--port", str(port)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/healthz", process)
    return f"http://127.0.0.1:{port}", process


def _row(name: str, result: dict[str, Any]) -> str:
    rps = f"{result['rps']:8.0f}" if "rps" in result else f"{result['rate']:8.0f}"
    return (
        f"{name:<34}{rps} {result['p50_ms']:9.2f} {result['p99_ms']:9.2f} {result['requests']:9d} "
        f"{result['failures']:6d}  {result.get('client', 'open loop')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--role", choices=["bare", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run (default 10)")
    parser.add_argument("--connections", type=int, default=32, help="concurrent connections when saturating")
    parser.add_argument("--rate", type=float, default=200.0, help="webhooks per second of the fixed-rate run")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds sent first and not counted")
    parser.add_argument("--playbooks", type=Path, help="playbook directory (default: the bundled playbooks)")
    args = parser.parse_args()
    if args.role == "bare":
        run_bare_server(args.port)
        return
    if args.role == "load":
        print(json.dumps(asyncio.run(_closed_loop(args.url, args.connections, args.duration))))
        return

    print(f"{'run':<34}{'req/s':>8} {'p50 ms':>9} {'p99 ms':>9} {'requests':>9} {'non200':>6}  client")
    bare_url, bare = bare_server()
    try:
        bare_saturated = saturate(f"{bare_url}/alertmanager", args.connections, args.duration)
        print(_row(f"bare aiohttp, {args.connections} connections", bare_saturated), flush=True)
        bare_rate = fixed_rate(f"{bare_url}/alertmanager", args.rate, args.duration, args.warmup)
        print(_row(f"bare aiohttp, {args.rate:g}/s", bare_rate), flush=True)
    finally:
        bare.terminate()
        bare.wait()
    settings = {"playbooks": {"dir": str(args.playbooks.resolve())}} if args.playbooks else {}
    with bot_process(settings) as (url, _process, workdir):
        bot_saturated = saturate(f"{url}/alertmanager", args.connections, args.duration)
        print(_row(f"gpu-alert-bot, {args.connections} connections", bot_saturated), flush=True)
        backlog = store_counts(workdir / "bot.db")
    with bot_process(settings) as (url, _process, workdir):
        bot_rate = fixed_rate(f"{url}/alertmanager", args.rate, args.duration, args.warmup)
        print(_row(f"gpu-alert-bot, {args.rate:g}/s", bot_rate), flush=True)
    ratio = bot_saturated["rps"] / bare_saturated["rps"]
    print(
        f"\nthroughput: {ratio:.0%} of the bare handler (goal >= 50%); "
        f"p99 at {args.rate:g}/s: {bot_rate['p99_ms']:.1f} ms (goal < 25 ms)"
    )
    print(f"worker backlog right after the saturation run (processed after the acknowledge): {backlog}")


if __name__ == "__main__":
    main()

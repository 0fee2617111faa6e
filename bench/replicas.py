"""Replicas benchmark: SQLite, then 1 and 2 replicas on PostgreSQL, under the same load, on the same machine.

    .venv/bin/python -m bench.replicas [--duration 10] [--connections 32]
    .venv/bin/python -m bench.replicas --rate 50 --new-alerts [--duration 30] [--replicas 2] [--gpus 800]

Each run starts fresh `gpu-alert-bot serve` processes (console output discarded) and a closed-loop client with
`--connections` connections posting 20-alert notifications, every one new, spread over the replicas as a load
balancer would. It prints acknowledged webhooks per second and the p99 time to acknowledge of each run. The
PostgreSQL server is Debian's (the one the tests start), on loopback, with its default durable settings. The
replicas and PostgreSQL share the machine's CPUs: the figures compare the backends, they do not measure scale-out.
It prints figures; it asserts nothing.

`--new-alerts` (bench/replicas_history.py): `--replicas` replicas on one PostgreSQL, enrichment on, and an
open-loop client posting `--rate` new GPU alerts a second (one a webhook, spread over the replicas); once the
workers are done, how many stored alerts have their GPU history ("History of this GPU") and why the others do not,
and the time each alert's GPU history took in the store (p50/p99, from the workers' metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import HARNESS, REPO, free_port, percentile, wait_ready, webhook_body
from tests.support.postgres import PostgresServer

_JSON = {"Content-Type": "application/json"}


@contextmanager
def _bot(workdir: Path, store: dict[str, Any], **settings: Any) -> Iterator[str]:
    """A replica of this checkout's bot (first on PYTHONPATH, whatever the virtualenv's editable install says)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {"store": store, "logging": {"level": "warning"}, **settings}
    (workdir / "bot.yaml").write_text(json.dumps(config))
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "bot",
        "serve",
        "--config",
        str(workdir / "bot.yaml"),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    with (workdir / "stderr.log").open("wb") as stderr:
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO, env=HARNESS.env())
        try:
            wait_ready(f"http://127.0.0.1:{port}/healthz", process)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            process.wait(30)


async def _load(urls: list[str], connections: int, duration: float, tag: str) -> dict[str, float]:
    latencies: list[float] = []
    failures = 0
    counter = itertools.count()
    deadline = time.perf_counter() + duration

    async def worker(session: aiohttp.ClientSession, url: str) -> None:
        nonlocal failures
        while time.perf_counter() < deadline:
            body = webhook_body(next(counter), tag)
            sent = time.perf_counter()
            async with session.post(
                f"{url}/alertmanager", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                await r.read()
                if r.status == 200:
                    latencies.append(time.perf_counter() - sent)
                else:
                    failures += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session, urls[n % len(urls)]) for n in range(connections)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {"rps": len(latencies) / elapsed, "p99_ms": percentile(latencies, 0.99) * 1000, "failed": failures}


def _run(name: str, stores: list[dict[str, Any]], workdir: Path, args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        urls = [stack.enter_context(_bot(workdir / f"replica{n}", store)) for n, store in enumerate(stores)]
        result = asyncio.run(_load(urls, args.connections, args.duration, tag=name[:2]))
    print(
        f"{name:<32} {result['rps']:8.0f} webhooks/s   p99 ack {result['p99_ms']:7.1f} ms   "
        f"refused {result['failed']:.0f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load per run")
    parser.add_argument("--connections", type=int, default=32, help="concurrent client connections")
    parser.add_argument("--new-alerts", action="store_true", help="GPU alerts at --rate, then their GPU history")
    parser.add_argument("--rate", type=float, default=50.0, help="--new-alerts: new alerts a second")
    parser.add_argument("--replicas", type=int, default=2, help="--new-alerts: replicas on one PostgreSQL")
    parser.add_argument("--gpus", type=int, default=800, help="--new-alerts: GPUs the alerts are spread over")
    parser.add_argument("--drain-limit", type=float, default=120.0, help="--new-alerts: seconds to wait for workers")
    args = parser.parse_args()
    if args.new_alerts:
        from bench.replicas_history import run_new_alerts

        run_new_alerts(args, _bot)
        return
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-replicas-") as tmp:
        workdir = Path(tmp)
        _run("sqlite, 1 process", [{"path": str(workdir / "sqlite" / "bot.db")}], workdir / "sqlite", args)
        server = PostgresServer()
        try:
            for replicas in (1, 2):
                (workdir / f"dsn{replicas}").write_text(server.create_database())
                stores = [
                    {"backend": "postgresql", "dsn_file": str(workdir / f"dsn{replicas}"), "replica": f"r{n}"}
                    for n in range(replicas)
                ]
                _run(f"postgresql, {replicas} replica(s)", stores, workdir / f"pg{replicas}", args)
        finally:
            server.close()


if __name__ == "__main__":
    main()

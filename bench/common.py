"""Shared by the benchmarks: a real `gpu-alert-bot serve` process, webhook bodies, percentiles, RSS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ALERTS_PER_WEBHOOK = 20
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
STARTS_AT = "2026-11-29T13:31:59.59202753Z"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):  # noqa: S310 (loopback URL built here)
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


@dataclass(frozen=True)
class Checkout:
    """A source tree whose bot is measured, so one harness can compare two commits. Its own `.venv` runs it when
    there is one, else this interpreter; either way with the tree as working directory and first on the path, so
    `python -m bot` imports the tree's `bot` and not the one installed in the harness's virtualenv."""

    root: Path

    @property
    def python(self) -> str:
        own = self.root / ".venv" / "bin" / "python"
        return str(own) if own.exists() else sys.executable

    def env(self) -> dict[str, str]:
        return dict(env_python(), PYTHONPATH=str(self.root))

    @cached_property
    def serve_roles(self) -> bool:
        """Whether its `serve` takes `--role ingest|worker|all` (ingest and worker in processes of their own)."""
        args = [self.python, "-m", "bot", "serve", "--help"]
        usage = subprocess.run(args, capture_output=True, text=True, check=True, cwd=self.root, env=self.env())
        return "--role" in usage.stdout


HARNESS = Checkout(REPO)


@contextmanager
def serve(
    workdir: Path, settings: dict[str, Any] | None = None, *options: str, checkout: Checkout = HARNESS
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`python -m bot serve` of `checkout` on the store `workdir/bot.db`, console output discarded, in a process
    group of its own: whatever processes it starts are measured (`bot_rss_mib`) and stopped with it."""
    config = {"store": {"path": str(workdir / "bot.db")}, "logging": {"level": "warning"}, **(settings or {})}
    config_path = workdir / "bot.yaml"
    config_path.write_text(json.dumps(config))
    port = free_port()
    args = [checkout.python, "-m", "bot", "serve", "--config", str(config_path), "--listen", f"127.0.0.1:{port}"]
    with (workdir / "stderr.log").open("ab") as stderr:
        process = subprocess.Popen(
            [*args, *options],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            cwd=checkout.root,
            env=checkout.env(),
            start_new_session=True,
        )
        try:
            wait_ready(f"http://127.0.0.1:{port}/healthz", process)
            yield f"http://127.0.0.1:{port}", process
        finally:
            _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    with contextlib.suppress(ProcessLookupError):  # whatever did not stop in time, or outlived its parent
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextmanager
def bot_process(
    settings: dict[str, Any] | None = None, *options: str, checkout: Checkout = HARNESS
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`serve` on a fresh store in a temporary directory; console output is discarded."""
    with (
        tempfile.TemporaryDirectory(prefix="gpu-alert-bot-bench-") as tmp,
        serve(Path(tmp), settings, *options, checkout=checkout) as (url, process),
    ):
        yield url, process, Path(tmp)


def webhook_body(n: int, tag: str = "b", alerts: int = ALERTS_PER_WEBHOOK, starts_at: str = STARTS_AT) -> bytes:
    """A 20-alert notification of its own group, every alert new: the most work an acknowledge can mean."""
    host = f"{tag}{n:07d}"
    items = [
        {
            "status": "firing",
            "labels": {"alertname": "GPUXidError", "host": host, "gpu": str(g), "severity": "critical", "xid": "79"},
            "annotations": {"summary": f"Xid 79 on {host} GPU {g}", "description": "GPU has fallen off the bus."},
            "startsAt": starts_at,
            "endsAt": GO_ZERO_TIME,
            "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3E+0&g0.tab=1",
            "fingerprint": f"{host}{g:02d}",
        }
        for g in range(alerts)
    ]
    payload = {
        "receiver": "gpu\\-alert\\-bot",
        "status": "firing",
        "alerts": items,
        "groupLabels": {"host": host},
        "commonLabels": {"alertname": "GPUXidError", "host": host},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": f'{{}}:{{host="{host}"}}',
        "truncatedAlerts": 0,
    }
    return (json.dumps(payload, separators=(",", ":")) + "\n").encode()


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident memory of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def bot_pids(root: int) -> set[int]:
    """A bot's processes: its process group and every descendant of its first process."""
    processes: dict[int, tuple[int, int]] = {}  # pid -> (parent, process group)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            fields = stat.read_text().rsplit(")", 1)[1].split()
            processes[int(stat.parent.name)] = (int(fields[1]), int(fields[2]))
    members = {pid for pid, (_parent, group) in processes.items() if group == root} | {root}
    grown = True
    while grown:
        children = {pid for pid, (parent, _group) in processes.items() if parent in members} - members
        members |= children
        grown = bool(children)
    return members


def bot_rss_mib(root: int) -> tuple[float, int]:
    """Resident memory summed over a bot's processes, and how many there were."""
    total, counted = 0.0, 0
    for pid in bot_pids(root):
        with contextlib.suppress(OSError, KeyError):  # KeyError: a process that ended but is not reaped yet
            total += rss_mib(pid)[0]
            counted += 1
    return total, counted


def bot_pss_mib(root: int) -> float:
    """Proportional set size summed over a bot's processes: pages they share (a forked worker) counted once."""
    total = 0.0
    for pid in bot_pids(root):
        with contextlib.suppress(OSError):
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            total += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")) / 1024
    return total


def store_counts(db: Path) -> dict[str, int]:
    with StoreReader(db) as reader:
        return reader.counts()


def pending_counts(db: Path) -> dict[str, int]:
    with StoreReader(db) as reader:
        return reader.pending()


class StoreReader:
    """A read-only connection to a running bot's SQLite store, to poll it. Each query runs to its end, so no read
    transaction stays open between polls: a reader left open would hold up the bot's WAL checkpoints.

    Webhooks the worker has not taken yet are in the store's inbox file (`bot.db-inbox`), when the bot measured is
    recent enough to have one."""

    def __init__(self, db: Path) -> None:
        self._conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        self._inbox = db.with_name(db.name + "-inbox")
        self._inbox_attached = False

    def pending(self) -> dict[str, int]:
        """Work still waiting: cheap (partial indexes), so it can be polled often."""
        [row] = self._conn.execute(
            f"""SELECT (SELECT COUNT(*) FROM notifications WHERE state = 'pending') + {self._not_taken()},
                      (SELECT COUNT(*) FROM events WHERE state = 'pending'),
                      (SELECT COUNT(*) FROM deliveries WHERE state = 'pending')"""  # noqa: S608
        ).fetchall()
        return dict(zip(("notifications_pending", "events_pending", "deliveries_pending"), row, strict=True))

    def _not_taken(self) -> str:
        """The SQL counting the inbox's webhooks the worker has not copied into the main file yet."""
        if not self._inbox_attached and self._inbox.exists():
            self._conn.execute("ATTACH ? AS inbox", (f"file:{self._inbox}?mode=ro",))
            self._inbox_attached = True
        if not self._inbox_attached:
            return "0"
        return "(SELECT COUNT(*) FROM inbox.inbox WHERE id > (SELECT COALESCE(MAX(up_to), 0) FROM inbox_taken))"

    def counts(self) -> dict[str, int]:
        [(alerts,)] = self._conn.execute("SELECT COUNT(*) FROM alerts").fetchall()
        return {"alerts": alerts, **self.pending()}

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


async def post_webhooks(url: str, count: int, tag: str, starts_at: str = STARTS_AT, concurrency: int = 16) -> None:
    """`count` notifications of `webhook_body`, `concurrency` at a time, each answered 200 or an error raised."""
    import aiohttp

    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(count):
        queue.put_nowait(n)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            n = queue.get_nowait()
            body = webhook_body(n, tag=tag, starts_at=starts_at)
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"webhook {n}: HTTP {response.status}")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))


def env_python() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")


def slack_bot_config(workdir: Path, api_url: str, token: str, log_level: str, **receiver: Any) -> Path:
    """A bot configuration file with one Slack receiver (pointed at the Slack fake) that gets every alert."""
    token_file = workdir / "slack_token"
    token_file.write_text(token)
    config = {
        "store": {"path": str(workdir / "bot.db")},
        "logging": {"level": log_level},
        "receivers": [
            {
                "type": "slack",
                "name": "slack",
                "channel": "#gpu-alerts",
                "token_file": str(token_file),
                "api_url": api_url,
                **receiver,
            }
        ],
        "routing": {"default": ["slack"]},
    }
    path = workdir / "bot.yaml"
    path.write_text(json.dumps(config))
    return path

"""Shared by the benchmarks: a real `gpu-alert-bot serve` process, webhook bodies, percentiles, RSS."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ALERTS_PER_WEBHOOK = 20
GO_ZERO_TIME = "0001-01-01T00:00:00Z"


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


@contextmanager
def bot_process(settings: dict[str, Any] | None = None) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`python -m bot serve` on a fresh store in a temporary directory; console output is discarded."""
    with tempfile.TemporaryDirectory(prefix="gpu-alert-bot-bench-") as tmp:
        workdir = Path(tmp)
        config = {"store": {"path": str(workdir / "bot.db")}, "logging": {"level": "warning"}, **(settings or {})}
        config_path = workdir / "bot.yaml"
        config_path.write_text(json.dumps(config))
        port = free_port()
        args = [sys.executable, "-m", "bot", "serve", "--config", str(config_path), "--listen", f"127.0.0.1:{port}"]
        with (workdir / "stderr.log").open("wb") as stderr:
            process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO)
            try:
                wait_ready(f"http://127.0.0.1:{port}/healthz", process)
                yield f"http://127.0.0.1:{port}", process, workdir
            finally:
                process.terminate()
                process.wait(30)


def webhook_body(n: int, tag: str = "b", alerts: int = ALERTS_PER_WEBHOOK) -> bytes:
    """A 20-alert notification of its own group, every alert new: the most work an acknowledge can mean."""
    host = f"{tag}{n:07d}"
    items = [
        {
            "status": "firing",
            "labels": {"alertname": "GPUXidError", "host": host, "gpu": str(g), "severity": "critical", "xid": "79"},
            "annotations": {"summary": f"Xid 79 on {host} GPU {g}", "description": "GPU has fallen off the bus."},
            "startsAt": "2026-11-29T13:31:59.59202753Z",
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


def store_counts(db: Path) -> dict[str, int]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            """SELECT (SELECT COUNT(*) FROM alerts),
                      (SELECT COUNT(*) FROM notifications WHERE state = 'pending'),
                      (SELECT COUNT(*) FROM events WHERE state = 'pending'),
                      (SELECT COUNT(*) FROM deliveries WHERE state = 'pending')"""
        ).fetchone()
    return dict(zip(("alerts", "notifications_pending", "events_pending", "deliveries_pending"), row, strict=True))


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

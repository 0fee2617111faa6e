"""Real Prometheus and Alertmanager (Debian packages), and the bot itself, as processes on loopback."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")
REPO = Path(__file__).resolve().parents[2]


# Each pytest-xdist worker (gw0, gw1, ...) hands out ports from a block of its own, below the kernel's ephemeral
# range (32768-60999 on Linux): two workers never pick the same port, and an outgoing connection's source port
# never takes one a test is about to listen on. A run without xdist uses the first block. Each process starts at a
# random place in its block, so runs in other checkouts at the same time seldom meet (the bind below skips a port
# in use).
_PORT_BLOCK_START = 10000
_PORT_BLOCK_SIZE = 2000
_PORT_BLOCKS = 11  # 10000-31999
_next_port_offset = itertools.count(random.randrange(_PORT_BLOCK_SIZE))


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")) % _PORT_BLOCKS


def free_port() -> int:
    """A loopback port nothing listens on, not handed out before in this worker (until its block wraps)."""
    start = _PORT_BLOCK_START + _worker_index() * _PORT_BLOCK_SIZE
    for _ in range(_PORT_BLOCK_SIZE):
        port = start + next(_next_port_offset) % _PORT_BLOCK_SIZE
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free loopback port in {start}-{start + _PORT_BLOCK_SIZE - 1}")


def find_binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError(f"none of {names} is installed; the README's test command installs them")


def wait_http(url: str, timeout: float = 20.0, process: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout} s: {last}")


class OutputCollector:
    """Reads a process's stdout or stderr line by line in a thread, so the pipe never fills up."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)

    def join(self, timeout: float = 5.0) -> None:
        self._thread.join(timeout)


class ManagedProcess:
    def __init__(self, args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.process = subprocess.Popen(
            self.args,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None and self.process.stderr is not None
        self.stdout = OutputCollector(self.process.stdout)
        self.stderr = OutputCollector(self.process.stderr)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self.stdout.join()
        self.stderr.join()
        return self.process.returncode

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


class Alertmanager(ManagedProcess):
    """A real Alertmanager on loopback, with `amtool` pointed at it. `port` starts it again where a stopped one
    was (same URL, so the same externalURL). Clustering is off unless `cluster_peers` is given (even empty): then
    it gossips on `cluster_port` (again the same one with `cluster_port`), joins those peers' cluster addresses,
    and its externalURL is its own URL, where the bot can ask its status. `peer_timeout` (clustered only) is
    how long each member waits for the ones before it to notify (Alertmanager's default, 15 s, unless given)."""

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any],
        port: int | None = None,
        *,
        cluster_peers: Sequence[str] | None = None,
        cluster_port: int | None = None,
        peer_timeout: str | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cluster_port = cluster_port or free_port()
        self.cluster_address = f"127.0.0.1:{self.cluster_port}"
        self.config_path = workdir / "alertmanager.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        if cluster_peers is None:
            cluster = ["--cluster.listen-address="]
        else:
            cluster = [
                f"--cluster.listen-address={self.cluster_address}",
                f"--cluster.advertise-address={self.cluster_address}",
                f"--web.external-url={self.url}",
                *(f"--cluster.peer={peer}" for peer in cluster_peers),
                *([f"--cluster.peer-timeout={peer_timeout}"] if peer_timeout else []),
            ]
        super().__init__(
            [
                find_binary(*ALERTMANAGER_BINARIES),
                f"--config.file={self.config_path}",
                f"--storage.path={workdir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                *cluster,
                "--log.level=warn",
            ],
            cwd=workdir,
        )
        wait_http(f"{self.url}/-/ready", process=self.process)

    def amtool(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [find_binary("amtool"), f"--alertmanager.url={self.url}", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=30,
        )


def webhook_alertmanager_config(
    bot_url: str,
    *,
    bearer_token: str | None = None,
    group_by: Sequence[str] = ("alertname", "host"),
    group_wait: str = "1s",
    group_interval: str = "2s",
    repeat_interval: str = "1h",
) -> dict[str, Any]:
    webhook: dict[str, Any] = {"url": f"{bot_url}/alertmanager", "send_resolved": True}
    if bearer_token is not None:
        webhook["http_config"] = {"authorization": {"type": "Bearer", "credentials": bearer_token}}
    return {
        "route": {
            "receiver": "bot",
            "group_by": list(group_by),
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        },
        "receivers": [{"name": "bot", "webhook_configs": [webhook]}],
    }


class Prometheus(ManagedProcess):
    """A real Prometheus on loopback with the given scrape config and rule files. It sends firing alerts again
    every second (1 min by default): an alert that fired before a reload pointed Prometheus at an Alertmanager
    (the discovery of which takes a few seconds) reaches it a second later, not a minute."""

    def __init__(self, workdir: Path, config: dict[str, Any], rule_files: Sequence[Path] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = dict(config)
        if rule_files:
            config["rule_files"] = [str(p) for p in rule_files]
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        super().__init__(
            [
                find_binary("prometheus"),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={workdir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--rules.alert.resend-delay=1s",
                "--log.level=warn",
            ],
            cwd=workdir,
        )
        wait_http(f"{self.url}/-/ready", timeout=30, process=self.process)


def wait_scraped(url: str, metric: str, series: int, timeout: float = 60.0) -> None:
    """Wait until the Prometheus at `url` holds at least `series` series of `metric`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = httpx.get(f"{url}/api/v1/query", params={"query": f"count({metric})"}, timeout=5).json()
        result = found["data"]["result"]
        if result and int(result[0]["value"][1]) >= series:
            return
        time.sleep(0.5)
    targets = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
    health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
    raise TimeoutError(f"Prometheus did not scrape {series} series of {metric}; its targets: {health}")


def backfill(
    workdir: Path,
    series: Mapping[str, float | Callable[[float], float]],
    start: float,
    end: float,
    interval: float = 15.0,
) -> None:
    """Write gauge samples every `interval` seconds over [start, end] into the TSDB a Prometheus(workdir) will
    open, with `promtool tsdb create-blocks-from openmetrics`: history without waiting for it. `series` maps an
    exposition-format series (`name{labels}`) to its constant value, or to its value at a time (Unix seconds)."""
    times = [start + index * interval for index in range(int((end - start) // interval) + 1)]
    lines: list[str] = []
    # OpenMetrics: each family once, its TYPE first, then its samples in time order.
    for name in sorted({text.split("{", 1)[0] for text in series}):
        lines.append(f"# TYPE {name} gauge")
        for text, value in series.items():
            if text.split("{", 1)[0] == name:
                lines.extend(f"{text} {value(at) if callable(value) else value} {at:.3f}" for at in times)
    exposition = workdir / "backfill.om"
    workdir.mkdir(parents=True, exist_ok=True)
    exposition.write_text("\n".join([*lines, "# EOF", ""]))
    subprocess.run(
        [
            find_binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(exposition),
            str(workdir / "prom-data"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


class BotProcess(ManagedProcess):
    """`python -m bot serve` as a real process: for crash (SIGKILL) and restart tests. Started once /readyz says
    ready (its worker runs), or, for `role="worker"`, once it logs that it is ready."""

    def __init__(
        self,
        config_path: Path,
        *,
        listen_port: int | None = None,
        store: Path | None = None,
        role: str = "all",
        worker_metrics_port: int | None = None,
    ) -> None:
        self.port = listen_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.worker_metrics_port = worker_metrics_port or free_port()
        args = [
            sys.executable,
            "-m",
            "bot",
            "serve",
            "--config",
            str(config_path),
            "--listen",
            f"127.0.0.1:{self.port}",
            # Not the default (the port after --listen's), which another test's process may hold.
            "--worker-metrics-listen",
            f"127.0.0.1:{self.worker_metrics_port}",
        ]
        if store is not None:
            args += ["--store", str(store)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        super().__init__([*args, "--role", role], cwd=config_path.parent, env=env)
        try:
            if role == "worker":
                self._wait_logged("gpu-alert-bot worker ready")
            else:
                # Two processes to start on a machine the tests keep busy: generous, as only a hang reaches it.
                wait_http(f"{self.url}/readyz", timeout=60, process=self.process)
        except TimeoutError:
            self.stop()  # SIGTERM: `--role all` stops its worker process too
            raise
        except RuntimeError as exc:
            self.stderr.join(1.0)
            said = "\n".join(self.stderr.snapshot()[-5:])
            raise RuntimeError(f"{exc}; its last words:\n{said}") from None

    def _wait_logged(self, message: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(f'"msg": "{message}"' in line for line in self.stderr.snapshot()):
            if self.process.poll() is not None:
                raise RuntimeError(f"process exited with {self.process.returncode} before it logged {message!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{message!r} not logged within {timeout} s")
            time.sleep(0.05)

    def kill_group(self) -> None:
        """SIGKILL the ingest process and its worker process at once, as a power cut would: `kill()` alone would
        let the worker see its parent gone and stop cleanly."""
        worker = self.worker_pid()
        if worker is not None:
            os.kill(worker, signal.SIGKILL)
        self.kill()

    def worker_pid(self) -> int | None:
        """The worker process that `serve --role all` started; None between a death and the restart."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        return int(children[0]) if children else None

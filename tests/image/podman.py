"""Small helpers around the podman and compose command lines, for tests/image/checks.py."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")


def run(
    *args: str | Path, timeout: float = 120.0, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, **env} if env else None
    command = [str(a) for a in args]
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False, env=environment
    )


def podman(*args: str | Path, timeout: float = 120.0, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run("podman", *args, timeout=timeout, stdin=stdin)


def output(done: subprocess.CompletedProcess[str]) -> str:
    return (done.stdout + done.stderr).strip()


def host_port() -> int:
    """A free loopback port of the host, to publish a container's port on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.25) -> T:
    """Ask `probe` until it returns something other than None; TimeoutError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        time.sleep(every)


def http_status(url: str, **kwargs: object) -> int | None:
    try:
        return httpx.request(str(kwargs.pop("method", "GET")), url, timeout=5.0, **kwargs).status_code  # type: ignore[arg-type]
    except httpx.HTTPError:
        return None


@dataclass
class Containers:
    """Containers and volumes one run creates, all removed at the end whatever happened."""

    prefix: str
    names: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)

    def name(self, role: str) -> str:
        name = f"{self.prefix}-{role}"
        self.names.append(name)
        return name

    def volume(self, role: str) -> str:
        name = f"{self.prefix}-{role}"
        done = podman("volume", "create", name)
        if done.returncode != 0:
            raise RuntimeError(f"podman volume create {name}: {output(done)}")
        self.volumes.append(name)
        return name

    def remove_all(self) -> None:
        for name in reversed(self.names):
            podman("rm", "--force", "--volumes", "--time", "2", name)  # --volumes: the image's VOLUME, anonymous
        for name in self.volumes:
            podman("volume", "rm", "--force", name)

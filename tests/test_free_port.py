"""free_port under pytest-xdist: each worker hands out ports of its own, below the kernel's ephemeral range, so
two workers never start servers on the same port and no outgoing connection takes one first."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.processes import free_port


def _ephemeral_start() -> int:
    low, _high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low)


def _ports(monkeypatch: pytest.MonkeyPatch, worker: str, count: int) -> list[int]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    return [free_port() for _ in range(count)]


def test_two_workers_hand_out_disjoint_ports_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _ports(monkeypatch, "gw0", 50), _ports(monkeypatch, "gw1", 50)
    assert not set(first) & set(second)
    assert max(first + second) < _ephemeral_start()
    assert len(set(first)) == len(first) and len(set(second)) == len(second)


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = []
    try:
        for port in _ports(monkeypatch, "gw2", 20):
            listener = socket.socket()
            listener.bind(("127.0.0.1", port))  # each port handed out is free
            listener.listen()
            listeners.append(listener)
        in_use = {listener.getsockname()[1] for listener in listeners}
        # The whole block once round: the 20 ports still listening are skipped.
        assert not in_use & set(_ports(monkeypatch, "gw2", 1990))
    finally:
        for listener in listeners:
            listener.close()

"""The open-loop client of the fixed-rate runs: requests leave at their scheduled times whatever the server does,
and each latency counts from the scheduled time, so a stalled server cannot hide its queue.

    python -m bench.openloop --url URL --rate 200 --duration 8 [--warmup 2]

prints one JSON line. `fixed_rate()` runs it in a process of its own, away from the server measured.

It speaks just enough HTTP/1.1 over at most 256 keep-alive connections (one request at a time on each, answers
with a Content-Length, as aiohttp's server gives) to cost a few tens of microseconds per request: aiohttp's client costs
about a millisecond of CPU per request on a loaded 2-core machine, which at 1,000 requests/s left the client,
not the server, behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import REPO, env_python, percentile, webhook_body

_ANSWER_TIMEOUT = 60.0  # after the last request was sent; what is unanswered by then counts as failed
_CONNECTIONS = 256
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Request:
    n: int
    data: bytes
    scheduled: float
    fired: float  # when the client got round to it: past `scheduled` only when the client itself lagged


@dataclass
class Tally:
    """What the run measured: the warm-up's requests are sent and awaited but not counted."""

    counted_from: int
    expected: int
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    latencies_ms: list[float] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    failures: int = 0
    answered: int = 0

    def record(self, request: Request, status: int) -> None:
        self.answered += 1
        if self.answered == self.expected:
            self.finished.set()
        if request.n >= self.counted_from:
            self.latencies_ms.append((time.perf_counter() - request.scheduled) * 1000)
            self.lags_ms.append((request.fired - request.scheduled) * 1000)
            self.failures += status != 200


class Pool:
    """Keep-alive connections, at most `limit` (the bot's own default limit): past it, requests wait for a free
    connection, their latency still counting from their scheduled time."""

    def __init__(self, host: str, port: int, tally: Tally, limit: int) -> None:
        self._host, self._port, self._tally, self._limit = host, port, tally, limit
        self._idle: list[_Connection] = []
        self._waiting: deque[Request] = deque()
        self._open = 0
        self._connecting: set[asyncio.Task[None]] = set()

    def submit(self, request: Request) -> None:
        if self._idle:
            self._idle.pop().send(request)
        elif self._open < self._limit:
            self._connect(request)
        else:
            self._waiting.append(request)

    def answered(self, connection: _Connection, request: Request, status: int) -> None:
        self._tally.record(request, status)
        if self._waiting:
            connection.send(self._waiting.popleft())
        else:
            self._idle.append(connection)

    def lost(self, connection: _Connection, request: Request | None) -> None:
        self._open -= 1
        if connection in self._idle:
            self._idle.remove(connection)
        if request is not None:
            self._tally.record(request, 0)
        if self._waiting:
            self._connect(self._waiting.popleft())

    def _connect(self, request: Request) -> None:
        self._open += 1
        task = asyncio.create_task(self._connect_and_send(request))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect_and_send(self, request: Request) -> None:
        loop = asyncio.get_running_loop()
        try:
            _transport, connection = await loop.create_connection(lambda: _Connection(self), self._host, self._port)
        except OSError:
            self._open -= 1
            self._tally.record(request, 0)
            return
        connection.send(request)


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._request: Request | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def send(self, request: Request) -> None:
        assert self._transport is not None
        self._request = request
        self._transport.write(request.data)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0 or self._request is None:
            return
        length = _CONTENT_LENGTH.search(self._buffer, 0, head_end)
        end = head_end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) < end:
            return
        status = int(self._buffer[9:12])
        del self._buffer[:end]
        request, self._request = self._request, None
        self._pool.answered(self, request, status)

    def connection_lost(self, exc: Exception | None) -> None:
        request, self._request = self._request, None
        self._pool.lost(self, request)


async def _open_loop(url: str, rate: float, duration: float, warmup: float) -> dict[str, Any]:
    target = urllib.parse.urlsplit(url)
    host, port = target.hostname or "127.0.0.1", target.port or 80
    skipped = int(rate * warmup)
    total = skipped + int(rate * duration)
    bodies = [_request(target.path, f"{host}:{port}", webhook_body(n, tag="r")) for n in range(total)]
    tally = Tally(counted_from=skipped, expected=total)
    pool = Pool(host, port, tally, _CONNECTIONS)

    def fire(n: int, scheduled: float) -> None:
        pool.submit(Request(n, bodies[n], scheduled, time.perf_counter()))

    start = time.perf_counter() + 0.2
    await asyncio.to_thread(_tick, asyncio.get_running_loop(), [start + n / rate for n in range(total)], fire)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tally.finished.wait(), _ANSWER_TIMEOUT)
    latencies, lags = sorted(tally.latencies_ms), sorted(tally.lags_ms)
    return {
        "rate": rate,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": latencies[-1] if latencies else float("nan"),
        "client_lag_p99_ms": percentile(lags, 0.99),
        "requests": total - skipped,
        # unanswered when the client gave up: counted, like the answers that were not 200
        "failures": tally.failures + total - skipped - len(latencies),
    }


def _request(path: str, host: str, body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


def _tick(loop: asyncio.AbstractEventLoop, schedule: list[float], fire: Callable[[int, float], None]) -> None:
    """Runs in a thread and starts each request at its time. The event loop's own timers wake on whole
    milliseconds (epoll's timeout), which would add up to 1 ms to every figure; a thread's sleep is off by tens
    of microseconds, and the loop wakes as soon as it is handed the request."""
    for n, scheduled in enumerate(schedule):
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        loop.call_soon_threadsafe(fire, n, scheduled)


def fixed_rate(url: str, rate: float, duration: float, warmup: float = 0.0) -> dict[str, Any]:
    """`rate` webhooks per second for `warmup` + `duration` seconds from a process of its own; the warm-up's
    requests are not counted."""
    args = [sys.executable, "-m", "bench.openloop", "--url", url, "--rate", str(rate), "--duration", str(duration)]
    args += ["--warmup", str(warmup)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, env=env_python(), cwd=REPO).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="where to POST, e.g. http://127.0.0.1:9095/alertmanager")
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (default 200)")
    parser.add_argument("--duration", type=float, default=10.0, help="counted seconds (default 10)")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds sent first and not counted (default 0)")
    args = parser.parse_args()
    # The ticker thread must get the interpreter lock back within 0.1 ms, not the default 5 ms.
    sys.setswitchinterval(1e-4)
    print(json.dumps(asyncio.run(_open_loop(args.url, args.rate, args.duration, args.warmup))))


if __name__ == "__main__":
    main()

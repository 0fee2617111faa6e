"""The open-loop client of the fixed-rate runs: requests leave at their scheduled times whatever the server does,
and each latency counts from the scheduled time, so a stalled server cannot hide its queue.

    python -m bench.openloop --url URL --rate 200 --duration 8 [--warmup 2]

prints one JSON line. `fixed_rate()` runs it in a process of its own, away from the server measured.

It speaks just enough HTTP/1.1 over keep-alive connections (one request at a time on each, answers with a
Content-Length, as aiohttp's server gives) to cost a few tens of microseconds per request: aiohttp's client costs
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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.common import REPO, env_python, percentile, webhook_body

_ANSWER_TIMEOUT = 60.0  # after the last request was sent; what is unanswered by then counts as failed
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


@dataclass
class Tally:
    """What the run measured: the warm-up's requests are sent but not counted."""

    counted_from: int
    expected: int
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    latencies_ms: list[float] = field(default_factory=list)
    lags_ms: list[float] = field(default_factory=list)
    failures: int = 0
    answered: int = 0

    def record(self, n: int, scheduled: float, sent: float, status: int) -> None:
        self.answered += 1
        self.failures += status != 200
        if self.answered == self.expected:
            self.finished.set()
        if n >= self.counted_from:
            self.latencies_ms.append((time.perf_counter() - scheduled) * 1000)
            self.lags_ms.append((sent - scheduled) * 1000)


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time; hands itself back to `idle` once answered."""

    def __init__(self, idle: list[_Connection], tally: Tally) -> None:
        self._idle = idle
        self._tally = tally
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._request: tuple[int, float, float] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def send(self, request: bytes, n: int, scheduled: float) -> None:
        assert self._transport is not None
        self._request = (n, scheduled, time.perf_counter())
        self._transport.write(request)

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
        self._tally.record(*self._request, status)
        self._request = None
        self._idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._request is not None:
            self._tally.record(*self._request, 0)
            self._request = None
        if self in self._idle:
            self._idle.remove(self)


async def _open_loop(url: str, rate: float, duration: float, warmup: float) -> dict[str, Any]:
    target = urllib.parse.urlsplit(url)
    host, port = target.hostname or "127.0.0.1", target.port or 80
    skipped = int(rate * warmup)
    total = skipped + int(rate * duration)
    requests = [_request(target.path, f"{host}:{port}", webhook_body(n, tag="r")) for n in range(total)]
    tally = Tally(counted_from=skipped, expected=total)
    idle: list[_Connection] = []
    loop = asyncio.get_running_loop()
    opening: set[asyncio.Task[None]] = set()

    async def send_on_new_connection(n: int, scheduled: float) -> None:
        try:
            _transport, connection = await loop.create_connection(lambda: _Connection(idle, tally), host, port)
        except OSError:
            tally.record(n, scheduled, time.perf_counter(), 0)
            return
        connection.send(requests[n], n, scheduled)

    def fire(n: int, scheduled: float) -> None:
        if idle:
            idle.pop().send(requests[n], n, scheduled)
            return
        task = asyncio.create_task(send_on_new_connection(n, scheduled))
        opening.add(task)
        task.add_done_callback(opening.discard)

    start = time.perf_counter() + 0.2
    await asyncio.to_thread(_tick, loop, [start + n / rate for n in range(total)], fire)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(tally.finished.wait(), _ANSWER_TIMEOUT)
    latencies, lags = sorted(tally.latencies_ms), sorted(tally.lags_ms)
    return {
        "rate": rate,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": latencies[-1],
        "send_lag_p99_ms": percentile(lags, 0.99),
        "requests": len(latencies),
        "failures": tally.failures + total - tally.answered,
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

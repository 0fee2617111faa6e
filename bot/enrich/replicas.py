"""The replicas of one source (a Prometheus HA pair): a query goes to one, and to the next when the first fails
or is slower than the hedge delay; the first answer wins and the others are cancelled, all within the query's
deadline.

The hedge delay is the source's `hedge_after`, or else twice the median of its recent answers (at least 50 ms,
at most a third of the deadline), so a healthy pair costs one query and a replica that hangs costs one delay. A
replica whose last query failed is asked after those whose last did not; one that failed `replica_failures` times
in a row is skipped for `replica_cooldown` (asked only once every other replica has failed, never as a hedge), and
`gpu_alert_bot_source_replica_skipped` says so; `gpu_alert_bot_source_requests_total` counts each replica's
queries by result.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bot.clock import Clock
from bot.enrich.queryapi import Deadline, QueryError, send
from bot.metrics import Metrics

_RECENT = 32
_MIN_HEDGE = 0.05
_FIRST_HEDGE_SHARE = 0.25  # of the deadline, before any answer was timed


@dataclass
class _Replica:
    url: str
    client: httpx.AsyncClient
    failures: int = 0
    skipped_until: float = 0.0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))


def _all_failed(failures: list[QueryError]) -> QueryError:
    """What every replica said, each naming itself: the first refusal alone would hide the other's timeout."""
    if len(failures) == 1:
        return failures[0]
    last = failures[-1]
    return QueryError(last.reason, "; ".join(f.detail for f in failures), retryable=last.retryable)


class ReplicaSet:
    def __init__(
        self,
        source: str,
        urls: Sequence[str],
        make_client: Callable[[str], httpx.AsyncClient],
        clock: Clock,
        *,
        hedge_after: float | None = None,
        failures_to_skip: int = 3,
        cooldown: float = 30.0,
        metrics: Metrics | None = None,
    ) -> None:
        self._source = source
        self._replicas = [_Replica(url, make_client(url)) for url in urls]
        self._clock = clock
        self._hedge_after = hedge_after
        self._failures_to_skip = failures_to_skip
        self._cooldown = cooldown
        self._metrics = metrics

    async def send(
        self, method: str, path: str, deadline: Deadline, *, service: str, error_text: Callable[[httpx.Response], str],
        **request: Any,
    ) -> httpx.Response:  # fmt: skip
        """The first replica's 2xx answer; QueryError (what each replica said) when none answers."""
        if len(self._replicas) == 1:  # no choice to make: the retries of `send` within the deadline
            return await send(self._replicas[0].client, method, path, deadline, service=service, error_text=error_text,
                              **request)  # fmt: skip

        def attempt(replica: _Replica) -> asyncio.Task[httpx.Response]:
            call = send(replica.client, method, path, deadline, service=f"{service} ({replica.url})",
                        error_text=error_text, attempts=1, **request)  # fmt: skip
            return asyncio.ensure_future(self._timed(replica, call))

        return await self._race(self._order(), attempt, deadline)

    async def _race(
        self,
        order: list[_Replica],
        attempt: Callable[[_Replica], asyncio.Task[httpx.Response]],
        deadline: Deadline,
    ) -> httpx.Response:
        running: dict[asyncio.Task[httpx.Response], _Replica] = {}
        failures: list[QueryError] = []
        waiting = list(order)
        now = self._clock.monotonic()
        try:
            while waiting or running:
                # A skipped replica is no hedge: it is asked only once every other has failed.
                hedge = waiting and waiting[0].skipped_until <= now
                if waiting and (not running or (hedge and await self._hedge_due(running, deadline))):
                    replica = waiting.pop(0)
                    running[attempt(replica)] = replica
                    continue
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    failure = task.exception()
                    if failure is None:
                        return task.result()
                    if not isinstance(failure, QueryError):
                        raise failure
                    failures.append(failure)
            raise _all_failed(failures)
        finally:
            for task, replica in running.items():
                task.cancel()
                self._count(replica, "cancelled")
            await asyncio.gather(*running, return_exceptions=True)

    async def _hedge_due(self, running: dict[asyncio.Task[httpx.Response], _Replica], deadline: Deadline) -> bool:
        """Whether the hedge delay passed before any running attempt ended (then ask the next replica)."""
        timer = asyncio.ensure_future(self._clock.sleep(self._hedge_delay(deadline)))
        try:
            done, _ = await asyncio.wait([timer, *running], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        return timer in done and not any(task in done for task in running)

    def _hedge_delay(self, deadline: Deadline) -> float:
        if self._hedge_after is not None:
            return self._hedge_after
        timed = [latency for replica in self._replicas for latency in replica.latencies]
        if not timed:
            return max(_MIN_HEDGE, deadline.seconds * _FIRST_HEDGE_SHARE)
        return min(max(_MIN_HEDGE, 2 * statistics.median(timed)), deadline.seconds / 3)

    def _order(self) -> list[_Replica]:
        """Replicas not skipped first: those whose last answer was no failure, the quickest first (one never timed
        counts as quick, so that it gets timed), then those failing now; the skipped ones last, still asked if all
        else fails."""
        now = self._clock.monotonic()

        def rank(replica: _Replica) -> tuple[bool, bool, float]:
            skipped = replica.skipped_until > now
            latency = statistics.median(replica.latencies) if replica.latencies else 0.0
            return skipped, replica.failures > 0, latency

        return sorted(self._replicas, key=rank)

    async def _timed(self, replica: _Replica, call: Awaitable[httpx.Response]) -> httpx.Response:
        started = self._clock.monotonic()
        try:
            response = await call
        except QueryError:
            self._failed(replica)
            raise
        replica.latencies.append(self._clock.monotonic() - started)
        replica.failures = 0
        if replica.skipped_until:
            replica.skipped_until = 0.0
            self._skipped(replica, False)
        self._count(replica, "ok")
        return response

    def _failed(self, replica: _Replica) -> None:
        self._count(replica, "failed")
        replica.failures += 1
        if replica.failures >= self._failures_to_skip:
            replica.skipped_until = self._clock.monotonic() + self._cooldown
            self._skipped(replica, True)

    def _count(self, replica: _Replica, result: str) -> None:
        if self._metrics is not None:
            self._metrics.source_requests.labels(self._source, replica.url, result).inc()

    def _skipped(self, replica: _Replica, skipped: bool) -> None:
        if self._metrics is not None:
            self._metrics.source_replica_skipped.labels(self._source, replica.url).set(1 if skipped else 0)

    async def close(self) -> None:
        for replica in self._replicas:
            await replica.client.aclose()

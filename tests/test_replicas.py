"""The replicas of a source: a query goes to one, and to the next when the first is slower than the hedge delay or
fails; a replica that keeps failing is asked last for a while (httpx's mock transport, a fake clock)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from bot.enrich.queryapi import Deadline, QueryError, body_text
from bot.enrich.replicas import ReplicaSet
from bot.metrics import Metrics
from tests.support.clock import FakeClock

A, B = "http://prom-a:9090", "http://prom-b:9090"


class Replicas:
    """Two replicas behind one mock transport: each answers with its name, hangs, or refuses connections."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.hanging: set[str] = set()
        self.down: set[str] = set()
        self._released = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        replica = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.asked.append(replica)
        if replica in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if replica in self.hanging:
            await self._released.wait()
        return httpx.Response(200, text=replica)

    def set(self, clock: FakeClock, metrics: Metrics, **options: Any) -> ReplicaSet:
        transport = httpx.MockTransport(self.handle)
        return ReplicaSet(
            "site-a", [A, B], lambda url: httpx.AsyncClient(base_url=url, transport=transport), clock,
            metrics=metrics, **options,
        )  # fmt: skip


async def _get(replicas: ReplicaSet) -> str:
    response = await replicas.send("GET", "/api/v1/query", Deadline(10.0), service="Prometheus", error_text=body_text)
    return response.text


async def test_a_replica_slower_than_the_hedge_delay_is_overtaken_by_the_other() -> None:
    clock, metrics, fake = FakeClock(), Metrics(), Replicas()
    replicas = fake.set(clock, metrics, hedge_after=0.3)
    assert await _get(replicas) == A and fake.asked == [A]  # healthy: one query
    fake.hanging.add(A)
    asking = asyncio.create_task(_get(replicas))
    while fake.asked.count(A) < 2:
        await asyncio.sleep(0)
    assert fake.asked == [A, A] and not asking.done()  # nothing else asked before the hedge delay
    await clock.advance(0.3)
    assert await asking == B
    sample = metrics.registry.get_sample_value
    assert sample("gpu_alert_bot_source_requests_total", {"source": "site-a", "replica": A, "result": "cancelled"})
    await replicas.close()


async def test_a_replica_that_keeps_failing_is_asked_last_until_its_cooldown_ends() -> None:
    clock, metrics, fake = FakeClock(), Metrics(), Replicas()
    replicas = fake.set(clock, metrics, hedge_after=0.3, failures_to_skip=3, cooldown=30.0)
    fake.down.add(A)
    for _ in range(3):  # refused at once: the other replica is asked without waiting for the hedge delay
        assert await _get(replicas) == B
    assert fake.asked == [A, B] * 3
    skipped = {"source": "site-a", "replica": A}
    assert metrics.registry.get_sample_value("gpu_alert_bot_source_replica_skipped", skipped) == 1
    fake.asked.clear()
    assert await _get(replicas) == B and fake.asked == [B]  # skipped: not asked first any more
    fake.down.clear()
    await clock.advance(30.0)
    fake.asked.clear()
    latency_free = await _get(replicas)
    assert fake.asked[0] == A and latency_free == A  # its cooldown over, it is asked first again
    assert metrics.registry.get_sample_value("gpu_alert_bot_source_replica_skipped", skipped) == 0
    await replicas.close()


async def test_when_no_replica_answers_the_error_says_what_each_said() -> None:
    """The first refused at once, the second did not answer in time: the refusal alone would hide the timeout."""
    clock, metrics, fake = FakeClock(), Metrics(), Replicas()
    replicas = fake.set(clock, metrics, hedge_after=0.3)
    fake.down.add(A)
    fake.hanging.add(B)
    asking = asyncio.create_task(
        replicas.send("GET", "/api/v1/query", Deadline(1.0), service="Prometheus", error_text=body_text)
    )
    while B not in fake.asked:
        await asyncio.sleep(0)
    await clock.advance(1.0)
    with pytest.raises(QueryError) as failed:
        await asking
    assert failed.value.reason == "timeout"
    assert f"Prometheus ({A})" in failed.value.detail and f"no answer from Prometheus ({B})" in failed.value.detail
    await replicas.close()

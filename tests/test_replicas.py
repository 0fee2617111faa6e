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
from tests.support.clock import FakeClock, running

A, B = "http://prom-a:9090", "http://prom-b:9090"


class Replicas:
    """Two replicas behind one mock transport: each answers with its name, answers after a second of the fake
    clock (slow), never answers (hanging), or refuses connections (down)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.asked: list[str] = []
        self.slow: set[str] = set()
        self.hanging: set[str] = set()
        self.down: set[str] = set()
        self._never = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        replica = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.asked.append(replica)
        if replica in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if replica in self.slow:
            await self.clock.sleep(1.0)
        if replica in self.hanging:
            await self._never.wait()
        return httpx.Response(200, text=replica)

    def set(self, metrics: Metrics, **options: Any) -> ReplicaSet:
        transport = httpx.MockTransport(self.handle)
        return ReplicaSet(
            "site-a", [A, B], lambda url: httpx.AsyncClient(base_url=url, transport=transport), self.clock,
            metrics=metrics, **options,
        )  # fmt: skip


async def _get(replicas: ReplicaSet) -> str:
    response = await replicas.send("GET", "/api/v1/query", Deadline(10.0), service="Prometheus", error_text=body_text)
    return response.text


async def test_a_replica_slower_than_the_hedge_delay_is_overtaken_by_the_other() -> None:
    clock, metrics = FakeClock(), Metrics()
    fake = Replicas(clock)
    replicas = fake.set(metrics, hedge_after=0.3)
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


async def test_a_replica_that_keeps_failing_is_skipped_until_its_cooldown_ends() -> None:
    clock, metrics = FakeClock(), Metrics()
    fake = Replicas(clock)
    replicas = fake.set(metrics, hedge_after=0.3, failures_to_skip=3, cooldown=30.0)
    skipped = {"source": "site-a", "replica": A}
    fake.down.add(A)
    fake.slow.add(B)
    async with running(clock):
        for _ in range(3):
            assert await _get(replicas) == B
        # Never timed, A is asked first and refuses; then B first, and A asked again as a hedge while B is slow.
        assert fake.asked == [A, B, B, A, B, A]
        assert metrics.registry.get_sample_value("gpu_alert_bot_source_replica_skipped", skipped) == 1
        fake.asked.clear()
        assert await _get(replicas) == B and fake.asked == [B]  # skipped: no hedge to it while B is slow
        fake.down.clear()
        await clock.sleep(30.0)
        fake.asked.clear()
        assert await _get(replicas) == A and fake.asked == [B, A]  # its cooldown over, a hedge again: it answers
    assert metrics.registry.get_sample_value("gpu_alert_bot_source_replica_skipped", skipped) == 0
    await replicas.close()


async def test_when_no_replica_answers_the_error_says_what_each_said() -> None:
    """The first refused at once, the second did not answer in time: the refusal alone would hide the timeout."""
    clock, metrics = FakeClock(), Metrics()
    fake = Replicas(clock)
    replicas = fake.set(metrics, hedge_after=0.3)
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


async def test_a_replica_that_just_failed_is_asked_after_the_one_that_answers_before_it_is_skipped() -> None:
    clock, metrics = FakeClock(), Metrics()
    fake = Replicas(clock)
    replicas = fake.set(metrics, hedge_after=0.3, failures_to_skip=3, cooldown=30.0)
    fake.down.add(A)
    assert await _get(replicas) == B and fake.asked == [A, B]  # A, never timed, was asked first
    fake.asked.clear()
    assert await _get(replicas) == B and fake.asked == [B]  # one failure: B first, though A is not skipped yet
    await replicas.close()

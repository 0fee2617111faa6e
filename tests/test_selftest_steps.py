"""The self-test's step runner: timing on the clock, progress lines, and a failure whatever a check raised."""

from __future__ import annotations

import asyncio
import io

import pytest

from bot.selftest.steps import StepFailed, Steps, as_json, duration, table
from bot.selftest.watch import Wait
from tests.support.bot import eventually
from tests.support.clock import FakeClock


async def test_each_step_is_timed_on_the_clock_and_printed_as_it_ends() -> None:
    clock, progress = FakeClock(), io.StringIO()
    steps = Steps(clock, progress)

    async def slow() -> str:
        await clock.advance(75)
        return "took a while"

    assert await steps.run("slow", slow)
    assert progress.getvalue() == "[pass] slow: took a while\n"
    assert "slow  pass    1 min 15 s  took a while" in table(steps.results)


async def test_a_failure_keeps_its_cause_and_where_to_look() -> None:
    steps = Steps(FakeClock(), io.StringIO())

    async def broken() -> str:
        raise StepFailed("it broke", "a cause", "a command")

    assert not await steps.run("broken", broken)
    text = table(steps.results)
    assert "likely cause: a cause" in text and "look further: a command" in text
    assert "self-test FAILED: 1 step(s) failed of 1" in text
    assert '"passed": false' in as_json(steps.results)


async def test_an_unexpected_error_fails_the_step_instead_of_ending_the_self_test() -> None:
    steps = Steps(FakeClock(), io.StringIO())

    async def surprising() -> str:
        raise ValueError("Expecting value: line 1 column 1 (char 0)")

    assert not await steps.run("prometheus rules", surprising)
    [result] = steps.results
    assert (result.outcome, result.detail) == (
        "FAIL",
        "unexpected error: Expecting value: line 1 column 1 (char 0)",
    )


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.04, "0.0 s"),
        (12.34, "12.3 s"),
        (59.97, "1 min"),
        (299, "4 min 59 s"),
        (299.6, "5 min"),
        (5399.9, "1 h 30 min"),
    ],
)
def test_a_duration_is_rounded_never_floored(seconds: float, said: str) -> None:
    assert duration(seconds) == said


async def test_a_wait_says_what_it_waits_for_and_for_how_long() -> None:
    clock, said = FakeClock(), []
    wait = Wait(clock, timeout=120, say=said.append)
    delivered = asyncio.Event()

    async def delivery() -> str | None:
        return "delivered" if delivered.is_set() else None

    task = asyncio.create_task(wait.until(delivery, "console to deliver the firing message", "a cause", "a look"))
    for _ in range(int(12 / 0.25)):  # 12 s of polls
        await eventually(lambda: clock.sleeping == 1)
        await clock.advance(0.25)
    delivered.set()
    await clock.advance(0.25)
    assert await task == "delivered"
    assert said == [
        "waiting for console to deliver the firing message: 5 s of 120 s",
        "waiting for console to deliver the firing message: 10 s of 120 s",
    ]


async def test_a_wait_that_times_out_says_the_timeout() -> None:
    clock = FakeClock()
    wait = Wait(clock, timeout=1, say=lambda line: None)

    async def never() -> str | None:
        return None

    task = asyncio.create_task(wait.until(never, "the bot to receive the firing alert", "a cause", "a look"))
    for _ in range(4):
        await eventually(lambda: clock.sleeping == 1)
        await clock.advance(0.25)
    with pytest.raises(StepFailed) as failed:
        await task
    assert failed.value.detail == "timed out waiting for the bot to receive the firing alert (--timeout 1.0 s)"

"""The self-test's step runner: timing on the clock, progress lines, and a failure whatever a check raised."""

from __future__ import annotations

import io

from bot.selftest.steps import StepFailed, Steps, as_json, table
from tests.support.clock import FakeClock


async def test_each_step_is_timed_on_the_clock_and_printed_as_it_ends() -> None:
    clock, progress = FakeClock(), io.StringIO()
    steps = Steps(clock, progress)

    async def slow() -> str:
        await clock.advance(75)
        return "took a while"

    assert await steps.run("slow", slow)
    assert progress.getvalue() == "[pass] slow: took a while\n"
    assert "slow  pass    1 min    took a while" in table(steps.results)


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
        "unexpected error: ValueError: Expecting value: line 1 column 1 (char 0)",
    )

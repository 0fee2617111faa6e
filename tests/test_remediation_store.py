"""Action runs and the circuit breaker in both real stores (SQLite, PostgreSQL): a state change is a
compare-and-set, both survive a reopen, and runs are pruned with
the rest of the history."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

from bot.storage.interface import ActionRun, BreakerState
from tests.support.clock import FakeClock
from tests.support.store import Opener


def new_run(clock: FakeClock) -> ActionRun:
    now = clock.now()
    return ActionRun(0, "restart-dcgm-exporter", "a@1", "gpu01", None, "cli:alice", False, False, "requested", now, now)


async def test_a_state_change_happens_once_and_survives_a_reopen(opened: Opener) -> None:
    clock = FakeClock()
    async with opened() as store:
        run = await store.add_action_run(new_run(clock))
        await clock.advance(5)
        moved = await store.transition_action_run(run.id, "requested", "approved", clock.now(), approvals=["cli:bob"])
        assert moved is not None and moved.state == "approved" and moved.approvals == ("cli:bob",)
        assert moved.updated_at == clock.now() and moved.detail == ""
        # A second approver racing the first finds the run moved on: nothing changes.
        assert await store.transition_action_run(run.id, "requested", "approved", clock.now()) is None
        await store.set_breaker(BreakerState(clock.now(), "5 hosts"))
    async with opened() as store:
        assert await store.get_action_run(run.id) == moved
        assert await store.action_runs(clock.now() - timedelta(hours=1), ("approved",)) == [moved]
        assert await store.action_runs(clock.now() - timedelta(hours=1), ("requested",)) == []
        assert await store.get_breaker() == BreakerState(clock.now(), "5 hosts")
        await store.set_breaker(None)
        assert await store.get_breaker() is None


async def test_a_breaker_reset_closes_it_and_starts_its_window_together(opened: Opener) -> None:
    clock = FakeClock()
    async with opened() as store:
        assert await store.breaker_window_start() is None
        await store.set_breaker(BreakerState(clock.now(), "3 hosts"))
        await clock.advance(60)
        await store.reset_breaker(clock.now())
    async with opened() as store:
        assert await store.get_breaker() is None
        assert await store.breaker_window_start() == clock.now()
        await clock.advance(60)
        await store.reset_breaker(clock.now())
        assert await store.breaker_window_start() == clock.now()


async def test_old_runs_are_pruned(opened: Opener) -> None:
    clock = FakeClock()
    async with opened() as store:
        old = await store.add_action_run(new_run(clock))
        await clock.advance(3600)
        recent = await store.add_action_run(new_run(clock))
        await store.prune(clock.now() - timedelta(minutes=30))
        assert await store.get_action_run(old.id) is None
        assert await store.get_action_run(recent.id) == recent


async def test_of_runs_moved_concurrently_from_one_state_exactly_one_move_wins(opened: Opener) -> None:
    clock = FakeClock()
    async with opened() as store:
        run = await store.add_action_run(new_run(clock))
        moves = await asyncio.gather(
            *(store.transition_action_run(run.id, "requested", "approved", clock.now(), f"{n}") for n in range(8))
        )
        [winner] = [moved for moved in moves if moved is not None]
        assert await store.get_action_run(run.id) == winner
        assert winner.state == "approved"


async def test_ids_go_on_and_a_run_keeps_its_fields(opened: Opener) -> None:
    clock = FakeClock()
    async with opened() as store:
        automatic = dataclasses.replace(new_run(clock), gpu="0", automatic=True, dry_run=True, detail="why")
        first = await store.add_action_run(automatic)
        second = await store.add_action_run(new_run(clock))
        assert second.id > first.id
        assert await store.get_action_run(first.id) == dataclasses.replace(automatic, id=first.id)
        assert await store.get_action_run(second.id + 1) is None
        assert await store.action_runs(clock.now()) == [first, second]

"""The outbox: persisted deliveries, two dispatchers (lanes) per receiver, retries with tenacity.

Each receiver drains its own queues, so one sink's outage never delays another. A receiver has two lanes: its
alerts' deliveries, in order (an update of a message never overtakes the post that created it), and its incidents'
(bot/incident/), so an alert outside an incident never waits behind an incident's backlog. An incident's delivery
carries its whole view: the newest pending version is sent and the older ones are set aside (superseded). The
newest versions of up to `_INCIDENTS_AT_ONCE` incidents go out side by side, each incident's in order, so one
incident's slow turn (its first card waiting for the channel's posts, a retry) never holds another incident's new
hosts back. A sink
may hold a delivery (an email digest's interval): that is no failed attempt, and the incident's newer versions
wait as long. While a delivery is retried the receiver's queue waits
behind it: when Slack is down, hammering it with the next message would not help. Every attempt is written
to the store first, so a restart resumes where the last process stopped. With several replicas on one store,
each receiver is dispatched by the replica that holds its lease (renewed while it runs); the others stand by.

A delivery that went out but whose outcome the store could not record (disk full) is remembered here and
recorded before this receiver sends anything else: it is never sent again while the store fails, and only a
process ending before the store recovers can repeat it, once. A graceful stop lets the attempt under way end
and be recorded instead of cutting it between the send and the record. An unexpected exception from a sink is
a bug no retry fixes: the delivery is set aside at once and the receiver's queue moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from tenacity import AsyncRetrying, RetryCallState, retry_if_result, wait_exponential, wait_random

from bot.clock import SYSTEM_CLOCK, Clock, wait_for_event, within
from bot.config import OutboxConfig
from bot.logs import RateLimitedLog
from bot.metrics import DeliveryOutcome, Metrics
from bot.models import Delivery
from bot.sinks.base import DeliveryResult, Sink
from bot.storage.interface import Lane, Store, StoreUnavailable

LANES: tuple[Lane, ...] = ("alerts", "incidents")

log = logging.getLogger(__name__)

_BATCH = 50
_INCIDENTS_AT_ONCE = 4
_IN_FLIGHT_RECHECK = 1.0
_IDLE_RECHECK = 30.0


@dataclass(frozen=True)
class _Outcome:
    """The end of a delivery, kept until the store has recorded it."""

    delivery_id: int
    delivered: bool
    error: str = ""


class Outbox:
    def __init__(
        self,
        store: Store,
        sinks: Mapping[str, Sink],
        config: OutboxConfig,
        metrics: Metrics,
        *,
        receiver_lease: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._clock = clock
        self._receiver_lease = receiver_lease
        self._holding = dict.fromkeys(sinks, False)
        self._sinks = dict(sinks)
        self._config = config
        self._metrics = metrics
        self._wakeups = {(name, lane): asyncio.Event() for name in self._sinks for lane in LANES}
        self._tasks: list[asyncio.Task[None]] = []
        self._unrecorded: dict[tuple[str, Lane], list[_Outcome]] = {
            (name, lane): [] for name in self._sinks for lane in LANES
        }
        self._recording = {(name, lane): asyncio.Lock() for name in self._sinks for lane in LANES}
        # A store outage fails every lane's every read: one line a minute per receiver says so, with a count.
        self._store_failures = RateLimitedLog(log, clock=clock.monotonic)
        self._attempts: set[asyncio.Task[DeliveryResult]] = set()

    @property
    def receivers(self) -> list[str]:
        return list(self._sinks)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._dispatch(sink, lane), name=f"outbox-{name}-{lane}")
            for name, sink in self._sinks.items()
            for lane in LANES
        ] + [asyncio.create_task(self._keep_lease(name), name=f"outbox-lease-{name}") for name in self._sinks]

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not any(task.done() for task in self._tasks)

    async def stop(self) -> None:
        """Stop sending. An attempt under way ends (within `attempt_timeout`) and its outcome is recorded: cut
        between the send and the record, it would be sent again after the restart."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.gather(*self._attempts, return_exceptions=True)
        await self._record_unrecorded_before_exit()
        for name, holding in self._holding.items():
            if holding:  # hand the receiver over at once rather than after the lease expires
                with contextlib.suppress(StoreUnavailable):
                    await self._store.release_receiver(name)
            self._holding[name] = False
        for sink in self._sinks.values():
            await sink.close()

    def wake(self, receivers: Iterable[str]) -> None:
        for name in receivers:
            for lane in LANES:
                if (name, lane) in self._wakeups:
                    self._wakeups[name, lane].set()

    async def _keep_lease(self, receiver: str) -> None:
        while True:
            try:
                held = await self._store.hold_receiver(receiver, self._receiver_lease)
            except StoreUnavailable:
                held = False  # the store cannot record a delivery either; another replica takes over at expiry
            if held != self._holding[receiver]:
                log.info("receiver " + ("taken over" if held else "handed over"), extra={"receiver": receiver})
                self._holding[receiver] = held
                self.wake([receiver])
            await self._clock.sleep(self._receiver_lease / 3)

    async def _dispatch(self, sink: Sink, lane: Lane) -> None:
        wakeup = self._wakeups[sink.name, lane]
        in_flight: dict[str, asyncio.Task[None]] = {}  # the incidents lane's deliveries under way, by incident
        try:
            while True:
                wakeup.clear()
                if not self._holding[sink.name]:
                    await self._wait(wakeup, _IDLE_RECHECK)
                    continue
                try:
                    await self._record_outcomes(sink.name, lane)
                    if lane == "incidents":
                        timeout = await self._start_incidents(sink, in_flight, wakeup)
                    else:
                        timeout = await self._deliver_alerts(sink)
                    if timeout is None:
                        continue
                except StoreUnavailable as exc:
                    self._metrics.error("store_unavailable")
                    self._store_failures.log(
                        logging.WARNING, sink.name, "outbox cannot read the store", receiver=sink.name, reason=str(exc)
                    )
                    timeout = self._config.initial_backoff
                except Exception:  # a bug must not silence this receiver until the next restart
                    self._metrics.error("outbox")
                    log.exception("outbox dispatcher error; will try again", extra={"receiver": sink.name})
                    timeout = self._config.max_backoff
                await self._wait(wakeup, timeout)
        finally:
            for task in in_flight.values():
                task.cancel()
            await asyncio.gather(*in_flight.values(), return_exceptions=True)

    async def _deliver_alerts(self, sink: Sink) -> float | None:
        """A batch of the alerts lane, in order; how long to wait for more (None: read again at once)."""
        batch = await self._store.due_deliveries(sink.name, _BATCH, "alerts")
        for delivery in batch:
            if not self._holding[sink.name]:
                break  # lost the receiver to another replica: it sends the rest
            await self._deliver(sink, "alerts", delivery)
        return None if batch else await self._idle_timeout(sink.name, "alerts")

    async def _start_incidents(
        self, sink: Sink, in_flight: dict[str, asyncio.Task[None]], wakeup: asyncio.Event
    ) -> float | None:
        """Start the newest version of each due incident not under way, up to `_INCIDENTS_AT_ONCE` at once; an
        ended one wakes the lane. A delivery's failure (the store, a bug) is raised here, once it has ended."""
        for key, task in list(in_flight.items()):
            if task.done():
                del in_flight[key]
                task.result()
        room = _INCIDENTS_AT_ONCE - len(in_flight)
        if room > 0:
            batch = await self._store.due_deliveries(sink.name, _INCIDENTS_AT_ONCE + len(in_flight), "incidents")
            for delivery in [d for d in batch if d.alert_key not in in_flight][:room]:
                task = asyncio.create_task(self._send_newest(sink, delivery), name=f"delivery-{delivery.id}-newest")
                task.add_done_callback(lambda _task: wakeup.set())
                in_flight[delivery.alert_key] = task
        if in_flight:  # the lane wakes when one ends; a version due meanwhile is seen within the recheck
            return _IN_FLIGHT_RECHECK
        return await self._idle_timeout(sink.name, "incidents")

    async def _send_newest(self, sink: Sink, delivery: Delivery) -> None:
        await self._store.supersede_deliveries(delivery)
        await self._deliver(sink, "incidents", delivery)

    async def _wait(self, wakeup: asyncio.Event, seconds: float) -> None:
        await wait_for_event(self._clock, wakeup, seconds)

    async def _idle_timeout(self, receiver: str, lane: Lane) -> float:
        due = await self._store.next_delivery_due(receiver, lane)
        if due is None:
            return _IDLE_RECHECK
        return min(_IDLE_RECHECK, max(0.0, (due - self._clock.now()).total_seconds()))

    async def _deliver(self, sink: Sink, lane: Lane, delivery: Delivery) -> None:
        backoff = wait_exponential(multiplier=self._config.initial_backoff, max=self._config.max_backoff) + wait_random(
            0, self._config.initial_backoff
        )
        deadline = delivery.created_at + timedelta(seconds=self._config.give_up_after)

        def wait(state: RetryCallState) -> float:
            result: DeliveryResult = state.outcome.result()  # type: ignore[union-attr]
            # A Retry-After past the deadline is only a late give-up: never wait beyond the deadline.
            asked = result.delay if result.delay is not None else backoff(state)
            return max(0.0, min(asked, (deadline - self._clock.now()).total_seconds()))

        async def persist_retry(state: RetryCallState) -> None:
            result: DeliveryResult = state.outcome.result()  # type: ignore[union-attr]
            sleep = state.next_action.sleep if state.next_action else 0.0
            next_at = self._clock.now() + timedelta(seconds=sleep)
            log.warning(
                "delivery will be retried",
                extra={
                    "receiver": sink.name,
                    "delivery_id": delivery.id,
                    "reason": result.reason,
                    "detail": result.detail,
                    "retry_in_s": round(sleep, 3),
                },
            )
            await self._store.delivery_retry(delivery.id, f"{result.reason}: {result.detail}", next_at)

        retrying = AsyncRetrying(
            retry=retry_if_result(lambda result: result.retry and not result.held),
            wait=wait,
            sleep=self._clock.sleep,
            stop=lambda _state: self._clock.now() >= deadline,
            before_sleep=persist_retry,
            retry_error_callback=lambda state: state.outcome.result(),  # type: ignore[union-attr]
        )
        result: DeliveryResult = await retrying(self._attempt, sink, lane, delivery)
        if result.delivered:
            # Recorded by the attempt, unless the store refused: then raise, and send nothing more until it is.
            await self._record_outcomes(sink.name, lane)
            return
        if result.held:  # the sink's choice, not a failure: it comes back then (or a newer version does)
            until = self._clock.now() + timedelta(seconds=result.delay or 0.0)
            await self._store.delivery_held(delivery, until, result.reason)
            return
        reason = result.reason if not result.retry else f"gave_up_{result.reason}"
        self._metrics.delivery_failures.labels(sink.name, reason).inc()
        self._metrics.error("delivery_failed")
        log.error(
            "delivery failed for good",
            extra={"receiver": sink.name, "delivery_id": delivery.id, "reason": reason, "detail": result.detail},
        )
        self._unrecorded[sink.name, lane].append(
            _Outcome(delivery.id, delivered=False, error=f"{reason}: {result.detail}")
        )
        await self._record_outcomes(sink.name, lane)

    async def _attempt(self, sink: Sink, lane: Lane, delivery: Delivery) -> DeliveryResult:
        """One attempt and, when it delivered, its record: shielded, so that stop() cannot cut between them."""
        attempt = asyncio.create_task(self._attempt_and_record(sink, lane, delivery), name=f"delivery-{delivery.id}")
        self._attempts.add(attempt)
        attempt.add_done_callback(self._attempts.discard)
        return await asyncio.shield(attempt)

    async def _attempt_and_record(self, sink: Sink, lane: Lane, delivery: Delivery) -> DeliveryResult:
        result = await self._attempt_once(sink, delivery)
        if result.delivered:
            self._unrecorded[sink.name, lane].append(_Outcome(delivery.id, delivered=True))
            # A store that cannot record it now leaves it in _unrecorded: nothing goes out before it is recorded.
            with contextlib.suppress(StoreUnavailable):
                await self._record_outcomes(sink.name, lane)
        return result

    async def _attempt_once(self, sink: Sink, delivery: Delivery) -> DeliveryResult:
        try:
            with self._metrics.delivery_duration.labels(sink.name).time():
                result = await within(self._clock, self._config.attempt_timeout, sink.deliver(delivery))
        except TimeoutError:
            result = DeliveryResult.retry_later("timeout", f"no answer within {self._config.attempt_timeout:g} s")
        except (OSError, StoreUnavailable) as exc:  # a transport or store error a later attempt can get past
            log.warning("sink raised", extra={"receiver": sink.name, "delivery_id": delivery.id, "reason": str(exc)})
            result = DeliveryResult.retry_later("exception", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a sink bug: retrying for a day would only hold up the messages behind it
            log.exception("sink raised", extra={"receiver": sink.name, "delivery_id": delivery.id})
            result = DeliveryResult.failed("exception", f"{type(exc).__name__}: {exc}")
        outcome: DeliveryOutcome = (
            "delivered" if result.delivered else ("held" if result.held else "retry" if result.retry else "failed")
        )
        self._metrics.deliveries.labels(sink.name, outcome).inc()
        return result

    async def _record_outcomes(self, receiver: str, lane: Lane) -> None:
        """Write the outcomes this receiver's lane is holding, oldest first; StoreUnavailable keeps the rest."""
        pending = self._unrecorded[receiver, lane]
        async with self._recording[receiver, lane]:  # the incidents' deliveries end together
            while pending:
                outcome = pending[0]
                if outcome.delivered:
                    await self._store.delivery_succeeded(outcome.delivery_id)
                else:
                    await self._store.delivery_failed(outcome.delivery_id, outcome.error)
                pending.pop(0)

    async def _record_unrecorded_before_exit(self) -> None:
        for (receiver, lane), pending in self._unrecorded.items():
            try:
                await self._record_outcomes(receiver, lane)
            except StoreUnavailable as exc:
                log.error(
                    "stopping with deliveries sent but not recorded; they will be sent again after the restart",
                    extra={"receiver": receiver, "delivery_ids": [o.delivery_id for o in pending], "reason": str(exc)},
                )

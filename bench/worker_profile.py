"""Worker throughput: how fast the worker drains a storm already in the store, enrichment off (no Loki, no
Prometheus), one console receiver; optionally under pyinstrument, to see where the time goes.

The store is filled first (webhooks of 20 new alerts each, written as ingest writes them), then the bot's runtime
starts in this process and the clock runs until every alert's event is routed and its delivery sent.
`--dedup` times only the store's dedup of the same storm, the bodies parsed again or the payloads ingest
validated handed over (parse once).

    .venv/bin/python -m bench.worker_profile [--alerts 20000] [--profile] [--top 25] [--dedup]

`--profile` needs pyinstrument (a dev tool, not a dependency of the bot: `.venv/bin/pip install pyinstrument`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import ALERTS_PER_WEBHOOK, webhook_body
from bot.config import BotConfig
from bot.dedup import plan_events
from bot.metrics import Metrics
from bot.models import WebhookPayload
from bot.playbooks import PlaybookSet
from bot.service.app import start_runtime
from bot.storage.interface import IncomingNotification
from bot.store.sqlite import SqliteStore

_POLL = 0.02
_DEDUP_BATCH = 8  # as the worker takes them


async def fill(path: Path, alerts: int) -> None:
    store = SqliteStore(path)
    await store.open()
    try:
        await ingest(store, alerts, hand_over=False)
    finally:
        await store.close()


async def ingest(store: SqliteStore, alerts: int, *, hand_over: bool) -> None:
    """As ingest stores webhooks; `hand_over` passes the validated payload along, as bot/ingest.py does."""
    for n in range(alerts // ALERTS_PER_WEBHOOK):
        raw = webhook_body(n)
        payload = WebhookPayload.model_validate_json(raw)
        await store.ingest(
            IncomingNotification(
                idempotency_key=payload.idempotency_key(),
                group_key=payload.group_key,
                receiver=payload.receiver_name,
                body=raw,
                alert_count=len(payload.alerts),
                payload=payload if hand_over else None,
            )
        )


async def dedup_seconds(path: Path, alerts: int, *, hand_over: bool) -> float:
    """Seconds the store's dedup takes over a storm ingested by the same store object."""
    store = SqliteStore(path)
    await store.open()
    try:
        await store.dedup_pending(plan_events, _DEDUP_BATCH)  # as the worker does from its start
        await ingest(store, alerts, hand_over=hand_over)
        started = time.perf_counter()
        while await store.dedup_pending(plan_events, _DEDUP_BATCH):
            pass
        return time.perf_counter() - started
    finally:
        await store.close()


async def run_dedup(alerts: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        parsed = await dedup_seconds(Path(tmp) / "parsed.db", alerts, hand_over=False)
        handed = await dedup_seconds(Path(tmp) / "handed.db", alerts, hand_over=True)
    print(f"dedup of {alerts} alerts ({alerts // ALERTS_PER_WEBHOOK} notifications of {ALERTS_PER_WEBHOOK})")
    print(f"bodies parsed again:        {parsed:6.2f} s  {alerts / parsed:8.0f} alerts/s")
    print(f"validated payloads handed:  {handed:6.2f} s  {alerts / handed:8.0f} alerts/s")


async def drain(path: Path) -> tuple[float, float]:
    """Seconds until every event is routed, and until every delivery is sent, from the runtime's start."""
    config = BotConfig.model_validate({"store": {"path": str(path)}, "logging": {"level": "warning"}})
    playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)  # start-up, not the worker
    started = time.perf_counter()
    runtime = await start_runtime(config, Metrics(), playbooks, io.StringIO())
    routed_after = 0.0
    try:
        while True:
            stats = await runtime.store.stats()
            if not routed_after and not (stats.notifications_pending or stats.events_pending):
                routed_after = time.perf_counter() - started
            if routed_after and not stats.deliveries_pending:
                return routed_after, time.perf_counter() - started
            await asyncio.sleep(_POLL)
    finally:
        await runtime.close()


@contextlib.contextmanager
def profiled(enabled: bool, top: int) -> Iterator[None]:
    if not enabled:
        yield
        return
    from pyinstrument import Profiler  # a dev tool, imported only when asked for

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False, short_mode=True)[: top * 400])
        print_top_functions(profiler, top)


def print_top_functions(profiler: object, top: int) -> None:
    """The functions with the most time of their own (self time), summed over every place they are called from."""
    session = profiler.last_session  # type: ignore[attr-defined]
    totals: dict[str, float] = {}

    def walk(frame: object) -> None:
        own = frame.total_self_time  # type: ignore[attr-defined]
        name = f"{frame.function} ({Path(frame.file_path_short or '?').name}:{frame.line_no})"  # type: ignore[attr-defined]
        totals[name] = totals.get(name, 0.0) + own
        for child in frame.children:  # type: ignore[attr-defined]
            walk(child)

    root = session.root_frame()
    if root is not None:
        walk(root)
    whole = sum(totals.values()) or 1.0
    print(f"\ntop {top} functions by own time:")
    for name, seconds in sorted(totals.items(), key=lambda item: -item[1])[:top]:
        print(f"  {seconds:7.3f} s  {100 * seconds / whole:5.1f} %  {name}")


async def run(alerts: int, profile: bool, top: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as tmp:
        path = Path(tmp) / "bot.db"
        await fill(path, alerts)
        with profiled(profile, top):
            routed, delivered = await drain(path)
    print(f"alerts: {alerts} ({alerts // ALERTS_PER_WEBHOOK} webhooks of {ALERTS_PER_WEBHOOK}), enrichment off")
    print(f"events routed:    {routed:6.2f} s  {alerts / routed:8.0f} alerts/s")
    print(f"deliveries sent:  {delivered:6.2f} s  {alerts / delivered:8.0f} alerts/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--alerts", type=int, default=20000)
    parser.add_argument("--profile", action="store_true", help="run under pyinstrument and print where time goes")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--dedup", action="store_true", help="time the store's dedup alone, with and without parse once"
    )
    args = parser.parse_args()
    asyncio.run(run_dedup(args.alerts) if args.dedup else run(args.alerts, args.profile, args.top))


if __name__ == "__main__":
    main()

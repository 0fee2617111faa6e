"""Alerts with a metric history, as the Prometheus enricher stores it, for the tests of pictures."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from bot.evidence import Enrichment, EnrichmentSection, PrometheusEvidence, PrometheusSeries, PrometheusWindow
from bot.message import Message
from bot.models import Delivery, NewDelivery
from bot.storage.interface import Store
from tests.support.payloads import STARTED, am_alert, webhook
from tests.support.store import ingest_and_dedup, route_event

STEP = 15.0
WINDOW = 2400.0
THRESHOLD = 87.0


def _series(query: str, start: float, shape: list[float]) -> PrometheusSeries:
    values = [(start + i * STEP, value) for i, value in enumerate(shape)]
    last = values[-1][1]
    return PrometheusSeries(
        query=query,
        values=values,
        current=last,
        current_text=f"{last:.0f}",
        min=min(shape),
        max=max(shape),
    )


def temperature_evidence(started_at: datetime = STARTED, *, gpu: str = "3") -> PrometheusEvidence:
    """A GPU warming from 62 to 92 °C across the 87 °C threshold, its power and utilisation beside it."""
    end = started_at.timestamp() + 600
    start = end - WINDOW
    points = int(WINDOW / STEP) + 1
    temperature = [62 + 30 / (1 + math.exp(-(i - points * 0.6) / 8)) for i in range(points)]
    selector = f'{{instance="k-ai-01:9400", gpu="{gpu}"}}'
    return PrometheusEvidence(
        expr="DCGM_FI_DEV_GPU_TEMP > 87",
        expr_source="generatorURL",
        graphed="DCGM_FI_DEV_GPU_TEMP",
        comparison=f"> {THRESHOLD:g}",
        window=PrometheusWindow(start=start, end=end, step=STEP),
        history=_series("DCGM_FI_DEV_GPU_TEMP", start, temperature),
        related={
            "temperature": _series(f"DCGM_FI_DEV_GPU_TEMP{selector}", start, temperature),
            "power": _series(
                f"DCGM_FI_DEV_POWER_USAGE{selector}",
                start,
                [300.0 + (250 if i > points // 2 else 0) for i in range(points)],
            ),
            "utilisation": _series(f"DCGM_FI_DEV_GPU_UTIL{selector}", start, [97.0] * points),
            "coolest_gpu": _series('min(DCGM_FI_DEV_GPU_TEMP{instance="k-ai-01:9400"})', start, [55.0] * points),
        },
    )


def enrichment(evidence: PrometheusEvidence) -> Enrichment:
    section = EnrichmentSection(
        name="prometheus", title="Metric history", status="ok", summary="current 92", data=evidence
    )
    return Enrichment(sections=[section])


def gpu_message(alert_key: str, *, gpu: str = "3", host: str = "k-ai-01", event: str = "firing") -> Message:
    return Message(
        alert_key=alert_key,
        fingerprint=alert_key.split("@")[0],
        group_key="g",
        event=event,
        status="resolved" if event == "resolved" else "firing",
        severity="critical",
        title=f"GPUTempCritical on {host} GPU {gpu}",
        summary=f"GPU {gpu} at 92 °C",
        host=host,
        gpu=gpu,
        alertname="GPUTempCritical",
        starts_at=STARTED,
        resolved_at=STARTED + timedelta(minutes=12) if event == "resolved" else None,
    )


async def stored_alert_delivery(store: Store, receiver: str, *, gpu: str = "3", host: str = "k-ai-01") -> Delivery:
    """A GPU alert through the store as the pipeline takes it: ingested, its history stored as its enrichment,
    and the delivery of its firing message to `receiver`."""
    await ingest_and_dedup(
        store,
        webhook([am_alert("GPUTempCritical", host=host, gpu=gpu)], group_key=f'{{}}:{{host="{host}",gpu="{gpu}"}}'),
    )
    [event] = await store.claim_events(10, 60)
    message = gpu_message(event.alert.key, gpu=gpu, host=host)
    stored = enrichment(temperature_evidence(gpu=gpu)).model_dump(mode="json")
    await route_event(store, event.id, stored, [NewDelivery(receiver=receiver, message=message)])
    return next(d for d in await store.due_deliveries(receiver, 100) if d.alert_key == event.alert.key)

"""Alertmanager webhook bodies for tests, shaped like the real captures (payload version 4), and the alert
episodes the store makes of them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.models import AlertState, alert_key

REPO = Path(__file__).resolve().parents[2]
SHARED_CAPTURES = REPO.parent / "shared" / "reference" / "alertmanager-captures"
FIXTURE_CAPTURES = REPO / "tests" / "fixtures" / "alertmanager-captures"

GO_ZERO_TIME = "0001-01-01T00:00:00Z"
STARTED = datetime(2026, 11, 29, 13, 31, 59, 592027, tzinfo=UTC)


def capture_files() -> list[Path]:
    """Every capture kept in the repository, and every one in ../shared when that checkout is present."""
    files = sorted(FIXTURE_CAPTURES.glob("*.json"))
    if SHARED_CAPTURES.is_dir():
        files += sorted(SHARED_CAPTURES.glob("*.json"))
    return files


def load_capture(path: Path) -> tuple[dict[str, str], bytes]:
    """(headers, raw body bytes exactly as Alertmanager sent them) of one capture file."""
    capture = json.loads(path.read_text())
    return capture["headers"], capture["raw_body"].encode()


def fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def am_alert(
    alertname: str = "GPUXidError",
    *,
    status: str = "firing",
    starts_at: datetime = STARTED,
    ends_at: datetime | None = None,
    annotations: dict[str, str] | None = None,
    **labels: str,
) -> dict[str, Any]:
    all_labels = {"alertname": alertname, "severity": "critical", **labels}
    if status == "resolved" and ends_at is None:
        ends_at = starts_at + timedelta(minutes=5)
    return {
        "status": status,
        "labels": all_labels,
        "annotations": annotations if annotations is not None else {"summary": f"{alertname} on {labels}"},
        "startsAt": rfc3339(starts_at),
        "endsAt": GO_ZERO_TIME if ends_at is None else rfc3339(ends_at),
        "generatorURL": "",
        "fingerprint": fingerprint(all_labels),
    }


def webhook(
    alerts: list[dict[str, Any]],
    *,
    group_key: str = '{}:{alertname="GPUXidError"}',
    receiver: str = "gpu\\-alert\\-bot",
    external_url: str = "http://am-0:9093",
    version: str = "4",
    **extra: Any,
) -> dict[str, Any]:
    common = set.intersection(*(set(a["labels"].items()) for a in alerts)) if alerts else set()
    return {
        "receiver": receiver,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "alerts": alerts,
        "groupLabels": {},
        "commonLabels": dict(sorted(common)),
        "commonAnnotations": {},
        "externalURL": external_url,
        "version": version,
        "groupKey": group_key,
        "truncatedAlerts": 0,
        **extra,
    }


def body(payload: dict[str, Any]) -> bytes:
    """Serialised like Go's json.Encoder: compact, ending with a newline."""
    return (json.dumps(payload, separators=(",", ":")) + "\n").encode()


def gpu_alerts(count: int, *, host: str = "k-ai-01", start: datetime = STARTED, **labels: str) -> list[dict[str, Any]]:
    return [am_alert(host=host, gpu=str(i), starts_at=start, **labels) for i in range(count)]


def distinct_webhooks(count: int, alerts_each: int, *, prefix: str = "batch") -> Iterator[dict[str, Any]]:
    """`count` notifications of distinct groups, each with `alerts_each` new alerts."""
    for n in range(count):
        host = f"{prefix}-{n:05d}"
        yield webhook(gpu_alerts(alerts_each, host=host), group_key=f'{{}}:{{host="{host}"}}')


def alert_state(
    labels: dict[str, str],
    *,
    starts_at: datetime = STARTED,
    fingerprint: str = "f",
    key: str | None = None,
    generator_url: str = "",
    annotations: dict[str, str] | None = None,
) -> AlertState:
    """A firing alert episode as the store hands it to the pipeline, first seen when it started."""
    return AlertState(
        key=key or alert_key(fingerprint, starts_at),
        fingerprint=fingerprint,
        status="firing",
        labels=labels,
        annotations=annotations or {},
        starts_at=starts_at,
        first_seen=starts_at,
        last_seen=starts_at,
        generator_url=generator_url,
    )

"""The bot's own metrics: every known label value is exported at 0 from the start, so increase() sees the first
error or delivery (a series born with its first increment has no earlier sample to compare with)."""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bot.metrics import DELIVERY_RESULTS, ERROR_KINDS, WEBHOOK_REFUSALS, Metrics
from bot.models import EventKind
from tests.support.bot import eventually, running_bot
from tests.support.processes import REPO


def _samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def _error_kinds_counted_in(source: Path) -> list[tuple[str, str | None]]:
    """(where, kind) of every `<x>.errors.labels(...)` and `<metrics>.error(...)` call: kind None when it is not
    a string literal."""
    found = []
    for node in ast.walk(ast.parse(source.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        func = node.func
        counts_labels = func.attr == "labels" and isinstance(func.value, ast.Attribute) and func.value.attr == "errors"
        counts_error = func.attr == "error" and "metrics" in ast.unparse(func.value).lower()
        if counts_labels or counts_error:
            [argument] = node.args
            kind = argument.value if isinstance(argument, ast.Constant) else None
            found.append((f"{source.relative_to(REPO)}:{node.lineno}", kind))
    return found


def test_every_error_kind_the_code_counts_is_in_the_list_that_starts_at_zero() -> None:
    counted = [hit for path in sorted((REPO / "bot").rglob("*.py")) for hit in _error_kinds_counted_in(path)]
    assert len(counted) >= 10  # the scan finds the call sites
    # A variable only where mypy checks it: Metrics.error (ErrorKind) and ingest's refusals (WebhookRefusal).
    typed = {"bot/metrics.py", "bot/ingest.py"}
    unlisted = [
        (where, kind)
        for where, kind in counted
        if kind not in ERROR_KINDS and not (kind is None and where.partition(":")[0] in typed)
    ]
    assert unlisted == []
    assert set(WEBHOOK_REFUSALS) <= set(ERROR_KINDS)


def test_a_fresh_registry_exports_every_error_kind_alert_status_and_event_kind_at_zero() -> None:
    metrics = Metrics()
    for kind in ERROR_KINDS:
        assert metrics.registry.get_sample_value("gpu_alert_bot_errors_total", {"kind": kind}) == 0.0, kind
    for status in ("firing", "resolved"):
        assert metrics.registry.get_sample_value("gpu_alert_bot_alerts_received_total", {"status": status}) == 0.0
    for event_kind in EventKind:
        assert metrics.registry.get_sample_value("gpu_alert_bot_events_total", {"kind": event_kind.value}) == 0.0


def test_metrics_error_counts_its_kind() -> None:
    metrics = Metrics()
    metrics.error("not_found")
    metrics.error("not_found")
    assert metrics.registry.get_sample_value("gpu_alert_bot_errors_total", {"kind": "not_found"}) == 2.0


async def test_each_configured_receiver_has_its_delivery_results_at_zero_before_any_delivery(tmp_path: Path) -> None:
    receivers = [{"name": "console", "type": "console"}, {"name": "night-shift", "type": "console"}]
    config = {"receivers": receivers, "routing": {"default": ["console"]}}
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(f"{bot.url}/metrics")).text
    deliveries = _samples(text, "gpu_alert_bot_deliveries_total")
    expected = {
        (("receiver", receiver["name"]), ("result", result)): 0.0
        for receiver in receivers
        for result in DELIVERY_RESULTS
    }
    assert deliveries == expected
    errors = _samples(text, "gpu_alert_bot_errors_total")
    assert errors == {(("kind", kind),): 0.0 for kind in ERROR_KINDS}
    # Per reason, so not known in advance: no series until the first failure.
    assert _samples(text, "gpu_alert_bot_delivery_failures_total") == {}


async def test_each_delivery_attempt_is_timed_per_receiver(tmp_path: Path) -> None:
    receivers = [{"name": "console", "type": "console"}, {"name": "night-shift", "type": "console"}]
    config = {"receivers": receivers, "routing": {"default": ["console"]}}
    payload = (REPO / "tests" / "fixtures" / "payloads" / "prom242_am025_e2e_firing.json").read_bytes()
    duration = "gpu_alert_bot_delivery_duration_seconds"
    delivered = {"receiver": "console", "result": "delivered"}
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
        before = _samples((await client.get(f"{bot.url}/metrics")).text, f"{duration}_count")
        response = await client.post(bot.webhook_url, content=payload, headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        await eventually(lambda: bot.metric("gpu_alert_bot_deliveries_total", delivered))
        text = (await client.get(f"{bot.url}/metrics")).text
    assert before == {(("receiver", "console"),): 0.0, (("receiver", "night-shift"),): 0.0}
    assert _samples(text, f"{duration}_count") == {(("receiver", "console"),): 1.0, (("receiver", "night-shift"),): 0.0}
    assert _samples(text, f"{duration}_sum")[(("receiver", "console"),)] > 0
    assert _samples(text, f"{duration}_bucket")[(("le", "+Inf"), ("receiver", "console"))] == 1.0

"""Enrichment sources that answer too much or answer garbage: every answer is read up to a cap (a huge, an
endless and a compressed answer alike), and what a source says in an error reaches a message as printable text
only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.config import LokiConfig
from bot.enrich.base import EnrichmentRequest
from bot.enrich.loki import QUERY_RANGE_PATH, LokiEnricher
from bot.enrich.queryapi import MAX_ANSWER_BYTES, Deadline, QueryError, body_text, send
from tests.fakes.loki import FakeLoki
from tests.support.bot import eventually
from tests.support.payloads import STARTED, alert_state, am_alert, body, webhook
from tests.support.processes import BotProcess

MB = 1024 * 1024
LOKI_SECTION = "Kernel log (Loki)"
QUERY = {"query": '{host="k-ai-01"}', "start": "1", "end": "2", "limit": "10"}


async def query(loki: FakeLoki, max_bytes: int) -> httpx.Response:
    async with httpx.AsyncClient(base_url=loki.url) as client:
        return await send(
            client,
            "GET",
            QUERY_RANGE_PATH,
            Deadline(10),
            service="Loki",
            error_text=body_text,
            max_bytes=max_bytes,
            params=QUERY,
        )


@pytest.mark.parametrize(
    ("size", "compressed"), [(3 * MB, False), (None, False), (40 * MB, True)], ids=["large", "endless", "gzip-bomb"]
)
async def test_an_answer_over_the_cap_is_refused_once_the_cap_is_read(size: int | None, compressed: bool) -> None:
    async with FakeLoki() as loki:
        loki.oversized(size, compressed=compressed)
        with pytest.raises(QueryError) as refused:
            await query(loki, max_bytes=MB)
    assert refused.value.reason == "too_large"
    assert refused.value.detail == "answer over 1 MB"
    assert not refused.value.retryable
    assert len(loki.range_queries) == 1, "an answer that is too large is not asked for again"


async def test_an_answer_under_the_cap_is_read_whole_and_decoded() -> None:
    async with FakeLoki() as loki:
        loki.oversized(MB // 2, compressed=True)
        response = await query(loki, max_bytes=MB)
    assert len(response.content) > MB // 2
    assert response.json()["status"] == "success"


async def test_garbage_in_an_error_answer_reaches_the_message_as_printable_text() -> None:
    garbage = "\x1b[2J\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\ \x9b31m\u202eboom\x07"
    async with FakeLoki() as loki:
        loki.fail(400, garbage)
        enricher = LokiEnricher(LokiConfig(url=loki.url), timeout=5)
        try:
            section = await enricher.enrich(EnrichmentRequest(alert_state({"host": "k-ai-01"}), None, {}))
        finally:
            await enricher.close()
    assert section.status == "unavailable"
    assert section.reason.isprintable()
    assert "\\x1b[2J" in section.reason
    assert "\\u202eboom\\x07" in section.reason


def test_every_query_error_detail_prints_whatever_the_service_said() -> None:
    """Prometheus's JSON error envelope, a transport error, a garbage body: all become a QueryError detail."""
    error = QueryError("api_error", "Prometheus: bad_data: \x1b]8;;http://evil.example\x1b\\\u2028x")
    assert error.detail == "Prometheus: bad_data: \\x1b]8;;http://evil.example\\x1b\\\\u2028x"
    assert str(error) == error.detail


def serve_with_loki(tmp_path: Path, loki: FakeLoki) -> BotProcess:
    (tmp_path / "playbooks").mkdir()
    config: dict[str, Any] = {
        "store": {"path": str(tmp_path / "bot.db")},
        "playbooks": {"dir": "playbooks"},
        "enrichment": {"budget": "20s", "loki": {"url": loki.url, "timeout": "15s"}},
    }
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    return BotProcess(tmp_path / "bot.yaml")


async def test_an_endless_loki_answer_costs_the_serve_process_at_most_the_cap(tmp_path: Path) -> None:
    async with FakeLoki() as loki:
        loki.oversized(None)
        bot = serve_with_loki(tmp_path, loki)
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                payload = body(webhook([am_alert(host="k-ai-01", gpu="0", starts_at=STARTED)]))
                answer = await client.post(
                    f"{bot.url}/alertmanager", content=payload, headers={"Content-Type": "application/json"}
                )
            assert answer.status_code == 200

            def delivered() -> list[dict[str, Any]]:
                return [json.loads(line) for line in bot.stdout.snapshot() if line.startswith("{")]

            [event] = await eventually(delivered, timeout=60)
        finally:
            bot.stop()
    assert event["sections"][LOKI_SECTION] == [f"Loki unavailable: answer over {MAX_ANSWER_BYTES // MB} MB"]

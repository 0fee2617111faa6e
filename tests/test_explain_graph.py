"""`explain PAYLOAD --enrich --graph out.png` writes the picture Slack and email would show, from a real
Prometheus's history (the realstack fixture of tests/test_prometheus_realstack.py)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from PIL import Image

from tests.support.exporter import dcgm_labels
from tests.support.payloads import am_alert, webhook
from tests.test_explain import explain
from tests.test_prometheus_realstack import HOST, Stack, _wait_until, stack  # noqa: F401 (the module's fixture)

pytestmark = [pytest.mark.realstack, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def _payload(tmp_path: Path, alertname: str = "GPUPowerEnvelopeExceeded") -> Path:
    """A webhook body with no generatorURL, as curl or amtool send it."""
    labels = dcgm_labels(5, hostname=HOST)
    started = datetime.now(UTC) - timedelta(seconds=20)
    alert = am_alert(alertname, starts_at=started, **{**labels, "severity": "warning"})
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(webhook([alert], group_key=f'{{}}:{{alertname="{alertname}"}}')))
    return path


def _config(tmp_path: Path, prometheus_url: str) -> Path:
    config = {
        "store": {"path": str(tmp_path / "bot.db")},
        "enrichment": {"prometheus": {"url": prometheus_url, "history": "60s"}},
        "receivers": [{"type": "console", "name": "console"}],
    }
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_explain_writes_the_alerts_graph(
    stack: Stack,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A few scrapes in Prometheus first: a history of one point has nothing to draw.
    _wait_until(lambda: stack.instant('count_over_time(DCGM_FI_DEV_POWER_USAGE{gpu="5"}[1m]) > 4'))
    out = tmp_path / "out.png"
    args = (str(_payload(tmp_path)), "--config", str(_config(tmp_path, stack.prometheus.url)), "--enrich")
    code, printed, _ = explain(capsys, *args, "--graph", str(out))
    assert code == 0, printed
    assert f"Graph:      {out}" in printed
    image = Image.open(io.BytesIO(out.read_bytes()))
    assert image.format == "PNG" and image.size[0] == 800


def test_explain_without_enrichment_has_no_history_to_draw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.png"
    code, printed, err = explain(
        capsys, str(_payload(tmp_path)), "--config", str(_config(tmp_path, "http://127.0.0.1:9")), "--graph", str(out)
    )
    assert code == 1 and not out.exists()
    assert "no metric history to draw: Prometheus was not asked (it is, with --enrich" in printed
    assert "no picture written" in err


def test_explain_enriched_says_an_alert_without_generator_url_or_rule_has_no_history(
    stack: Stack,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.png"
    payload = _payload(tmp_path, alertname="GPUXidError")  # not the name of any rule Prometheus evaluates
    config = _config(tmp_path, stack.prometheus.url)
    code, _, err = explain(capsys, str(payload), "--config", str(config), "--enrich", "--graph", str(out))
    assert code == 1 and not out.exists()
    reason = "the alert's generatorURL is empty and Prometheus has no alerting rule named 'GPUXidError'"
    assert f"no picture written: no metric history to draw: {reason}" in err
    assert "--enrich" not in err

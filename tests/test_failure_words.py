"""A failed call is said as what happened, never as the class name of the library that raised it: real failures
(a host name that cannot resolve, a loopback port nothing listens on) through the self-test's checks, the
health check (and a sink: tests/test_pagerduty.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.commands.healthcheck import probe
from bot.config import PrometheusConfig, SlackReceiver
from bot.failure import what_failed
from bot.selftest.checks import prometheus_ready, slack_receiver
from bot.selftest.steps import StepFailed
from tests.fakes.slack import DEFAULT_TOKEN
from tests.support.processes import free_port

# Reserved never to resolve (RFC 6761).
UNRESOLVABLE = "gpu-alert-bot-test.invalid"
NOT_RESOLVED = "could not resolve the host name"
REFUSED = "connection refused (nothing listens there)"
# What the libraries call these failures: ClientConnectorDNSError, ConnectError, ClientConnectorError...
CLASS_NAME = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*(?:Error|Exception|Timeout)\b")


def _slack(tmp_path: Path, api_url: str) -> SlackReceiver:
    token = tmp_path / "slack_token"
    token.write_text(DEFAULT_TOKEN + "\n")
    return SlackReceiver.model_validate(
        {"type": "slack", "name": "slack", "channel": "#gpu", "token_file": str(token), "api_url": api_url}
    )


async def _step_detail(check: object) -> str:
    with pytest.raises(StepFailed) as failed:
        await check  # type: ignore[misc]
    return failed.value.detail


@pytest.mark.parametrize(("host", "said"), [(UNRESOLVABLE, NOT_RESOLVED), ("127.0.0.1", REFUSED)])
async def test_the_self_test_says_what_failed_reaching_prometheus(host: str, said: str) -> None:
    url = f"http://{host}:{free_port()}"
    detail = await _step_detail(prometheus_ready(PrometheusConfig(url=url, timeout=5)))
    assert detail.startswith(f"cannot reach Prometheus at {url}/-/ready: {said}")
    assert not CLASS_NAME.search(detail), detail


@pytest.mark.parametrize(("host", "said"), [(UNRESOLVABLE, NOT_RESOLVED), ("127.0.0.1", REFUSED)])
async def test_the_self_test_says_what_failed_reaching_slack(tmp_path: Path, host: str, said: str) -> None:
    api_url = f"http://{host}:{free_port()}/api/"
    detail = await _step_detail(slack_receiver(_slack(tmp_path, api_url)))
    assert detail.startswith(f"Slack is down or unreachable: cannot reach {api_url}: {said}")
    assert not CLASS_NAME.search(detail), detail


def test_the_health_check_says_nothing_listens(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert not probe("127.0.0.1", port, timeout=5)
    assert capsys.readouterr().err == f"http://127.0.0.1:{port}/healthz: {REFUSED}\n"


def test_an_error_of_no_known_kind_says_its_own_message() -> None:
    assert what_failed(ValueError("Expecting value: line 1 column 1 (char 0)")) == (
        "Expecting value: line 1 column 1 (char 0)"
    )

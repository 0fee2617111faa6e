"""The self-test's dependency checks against real Prometheus and aiosmtpd, and the Loki fake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bot.config import EmailReceiver, LokiConfig, PrometheusConfig
from bot.selftest import checks
from bot.selftest.steps import StepFailed
from tests.fakes.loki import FakeLoki
from tests.support.clock import FakeClock, running
from tests.support.processes import Prometheus, free_port
from tests.support.rules import SHIPPED_RULES, quick_rules
from tests.test_email import USERS, Pki, make_pki, smtp_server

WEEK = 7 * 24 * 3600.0
PROMETHEUS_CONFIG = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": []}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def prometheus(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Prometheus]:
    groups = getattr(request, "param", None)
    rules = quick_rules(sorted(SHIPPED_RULES.glob("*.yml")), tmp_path / "rules.yml", groups)
    started = Prometheus(tmp_path / "prom", PROMETHEUS_CONFIG, [rules])
    yield started
    started.stop()


def mail_receiver(tmp_path: Path, port: int, pki: Pki, password: str) -> EmailReceiver:
    password_file = tmp_path / "smtp_password"
    password_file.write_text(password)
    [(user, _)] = USERS.items()
    return EmailReceiver.model_validate(
        {
            "type": "email",
            "name": "mail",
            "to": ["oncall@example.com"],
            "from": "gpu-alert-bot@example.com",
            "smarthost": f"127.0.0.1:{port}",
            "ca_file": str(pki.ca_file),
            "username": user,
            "password_file": str(password_file),
            "timeout": 5,
        }
    )


async def test_smtp_goes_as_far_as_auth_and_sends_nothing(tmp_path: Path, pki: Pki) -> None:
    [(_, password)] = USERS.items()
    with smtp_server("starttls", pki.trusted, auth=True) as (port, handler):
        detail = await checks.email_receiver(mail_receiver(tmp_path, port, pki, password))
    assert detail == f"127.0.0.1:{port}: connected, STARTTLS, AUTH; no mail sent"
    assert handler.received() == []


@pytest.mark.parametrize("problem", ["wrong password", "untrusted certificate"])
async def test_smtp_problems_fail_the_step_with_the_servers_reason(tmp_path: Path, pki: Pki, problem: str) -> None:
    [(_, password)] = USERS.items()
    context = pki.untrusted if problem == "untrusted certificate" else pki.trusted
    with smtp_server("starttls", context, auth=True) as (port, _handler):
        receiver = mail_receiver(tmp_path, port, pki, "nope" if problem == "wrong password" else password)
        with pytest.raises(StepFailed) as failed:
            await checks.email_receiver(receiver)
    expected = "535" if problem == "wrong password" else "certificate"
    assert expected in failed.value.detail
    assert failed.value.look == f"openssl s_client -starttls smtp -connect 127.0.0.1:{port}"


async def test_prometheus_with_the_shipped_rules_and_the_watchdog_firing_passes(prometheus: Prometheus) -> None:
    config = PrometheusConfig(url=prometheus.url)
    assert await checks.prometheus_ready(config) == f"{prometheus.url} is ready"
    # Asked as soon as Prometheus is ready: the check waits for the first evaluation of the Watchdog's group.
    detail = await checks.prometheus_rules(config, "Watchdog")
    assert detail == f"{len(checks.shipped_alert_names(SHIPPED_RULES))} rules loaded, Watchdog firing"


def rules_evaluated_every(tmp_path: Path, interval: str) -> Path:
    """The shipped rules, the Watchdog's group evaluated every `interval` (a week: not once during the test)."""
    rules = quick_rules(sorted(SHIPPED_RULES.glob("*.yml")), tmp_path / "rules.yml")
    groups = yaml.safe_load(rules.read_text())["groups"]
    for group in groups:
        if any(rule.get("alert") == "Watchdog" for rule in group["rules"]):
            group["interval"] = interval
    rules.write_text(yaml.safe_dump({"groups": groups}))
    return rules


async def test_a_watchdog_not_evaluated_yet_is_waited_for_one_interval_of_its_group(tmp_path: Path) -> None:
    """Prometheus evaluates a group first within one interval of starting: until then its Watchdog is not firing,
    and that is no missing rule."""
    prometheus = Prometheus(tmp_path / "prom", PROMETHEUS_CONFIG, [rules_evaluated_every(tmp_path, "1w")])
    clock, said = FakeClock(), []
    try:
        async with running(clock):
            with pytest.raises(StepFailed) as failed:
                await checks.prometheus_rules(
                    PrometheusConfig(url=prometheus.url), "Watchdog", clock=clock, limit=WEEK * 2, say=said.append
                )
    finally:
        prometheus.stop()
    assert clock.monotonic() >= WEEK  # not called missing before its group's interval passed
    assert said == [
        "waiting for Prometheus to evaluate the Watchdog rule a first time (its group monitoring runs every "
        "604800 s): up to 168 h"
    ]
    assert failed.value.detail == (
        "Prometheus has not evaluated the Watchdog rule in 168 h (its group monitoring runs every 604800 s): rule "
        "evaluation is stuck"
    )


@pytest.mark.parametrize("prometheus", [("monitoring",)], indirect=True)
async def test_prometheus_without_the_shipped_rules_fails_naming_them(prometheus: Prometheus) -> None:
    with pytest.raises(StepFailed) as failed:
        await checks.prometheus_rules(PrometheusConfig(url=prometheus.url), "Watchdog")
    assert "shipped rule(s) not loaded: ContainerRestartLoop" in failed.value.detail
    assert failed.value.cause == "prometheus.yml's rule_files does not include config/rules/*.yml"


async def test_prometheus_down_fails_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StepFailed) as failed:
        await checks.prometheus_ready(PrometheusConfig(url=url))
    assert failed.value.detail.startswith(f"cannot reach Prometheus at {url}/-/ready")


async def test_loki_readiness() -> None:
    async with FakeLoki() as loki:
        assert await checks.loki_ready(LokiConfig(url=loki.url)) == f"{loki.url} is ready"
        await loki.go_down()
        with pytest.raises(StepFailed) as failed:
            await checks.loki_ready(LokiConfig(url=loki.url))
    assert failed.value.cause == "Loki is down or not at this URL"

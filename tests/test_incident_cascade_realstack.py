"""One cause, one incident, for real: a fleet of 48 hosts (4 rows of 3 racks, two GPU models, one driver) scraped by
a real Prometheus evaluating the shipped GPU and chassis rules (`for:` and intervals shortened, expressions
untouched), a real Alertmanager with the shipped grouping and inhibitions delivering to the bot, and the bot telling
Slack (the fake), a real SMTP server and PagerDuty (the Events API fake).

Row C's cooling fails: its inlet air warms first (InletTemperatureHigh on its 12 hosts), then its GPUs overheat
(GPUTempCritical, GPUMemoryTempHigh's warning and critical, GPUThermalThrottling). At the same time an Xid burst
hits 8 hosts of rows A and B, and uncorrectable ECC errors 6 hosts picked at random elsewhere. Each receiver tells
three incidents, each once: the cascade as one, named facility cooling in row C from its first card; the burst and
the random sample each on their own, the sample claiming nothing. Every figure of the cooling card is checked
against the fleet."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fakes.pagerduty import FakePagerDuty
from tests.fakes.slack import FakeSlack, SlackMessage
from tests.support.bot import eventually, running_bot
from tests.support.cooling import (
    alert_to,
    gpu_labels,
    healthy_fleet,
    overheat,
    shipped_alertmanager_config,
    warm_inlet,
    xid_burst,
)
from tests.support.exporter import (
    DCGM_ECC_DBE_VOL_TOTAL,
)
from tests.support.fleet import SyntheticFleet
from tests.support.pagerduty_receiver import pagerduty_receiver
from tests.support.processes import Alertmanager, Prometheus
from tests.support.rules import SHIPPED_RULES, quick_rules
from tests.support.slack_receiver import slack_receiver
from tests.test_email import Pki, make_pki, smtp_server
from tests.test_email_e2e import email_receiver

pytestmark = pytest.mark.realstack

ROWS, RACKS, PER_RACK, GPUS = "ABCD", 3, 4, 2
HOT_ROW = "C"


def fleet_layout() -> dict[str, str]:
    """host -> rack: 4 rows of 3 racks of 4 hosts."""
    return {
        f"gpu-{row.lower()}{rack}{n}": f"{row}{rack}"
        for row in ROWS
        for rack in range(1, RACKS + 1)
        for n in range(PER_RACK)
    }


RACK_OF = fleet_layout()
HOT = [host for host, rack in RACK_OF.items() if rack[0] == HOT_ROW]
BURST = [host for host, rack in RACK_OF.items() if rack[0] in "AB"][::3]  # 8 hosts of rows A and B
SAMPLE = random.Random(7).sample([h for h, rack in RACK_OF.items() if rack[0] in "BD" and h not in BURST], 6)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def fleet() -> Iterator[SyntheticFleet]:
    with healthy_fleet(RACK_OF, GPUS) as started:
        yield started


def ecc_sample(fleet: SyntheticFleet) -> None:
    for host in SAMPLE:
        fleet.host(host).inc(DCGM_ECC_DBE_VOL_TOTAL, gpu_labels(host, 1), 1)


def scraped(prometheus: Prometheus) -> bool:
    query = f"count(count_over_time(up[1m]) >= 2) == {len(RACK_OF)}"
    return bool(
        httpx.get(f"{prometheus.url}/api/v1/query", params={"query": query}, timeout=5).json()["data"]["result"]
    )


def cards(slack: FakeSlack) -> list[SlackMessage]:
    """The incident cards in the channel (the first alerts of a storm, told before it was one, keep their own)."""
    return [m for m in slack.top_level() if "*Scope:*" in m.rendered_text()]


def incident_pages(pagerduty: FakePagerDuty) -> list[str]:
    return [key for key in pagerduty.alerts if key.startswith("incident:")]


def card_of(slack: FakeSlack, word: str) -> SlackMessage | None:
    found = [m for m in cards(slack) if word in m.rendered_text()]
    return found[0] if len(found) == 1 else None


async def test_a_cooling_cascade_is_one_incident_beside_an_xid_burst_and_a_random_sample(
    tmp_path: Path, pki: Pki, slack: FakeSlack, fleet: SyntheticFleet
) -> None:
    rules = quick_rules([SHIPPED_RULES / "gpu-alerts.yml", SHIPPED_RULES / "hardware-alerts.yml"], tmp_path / "r.yml")
    scrape = fleet.scrape_config(tmp_path / "targets.json", {host: {"rack": rack} for host, rack in RACK_OF.items()})
    prometheus = Prometheus(tmp_path / "prom", scrape, [rules])
    try:
        with smtp_server("starttls", pki.trusted) as (port, mails):
            async with FakePagerDuty() as pagerduty:
                config = {
                    "receivers": [
                        slack_receiver(tmp_path, slack),
                        {**email_receiver(port, pki), "digest_interval": "2s"},
                        pagerduty_receiver(tmp_path, pagerduty),
                    ],
                    "routing": {"default": ["slack", "oncall-email", "pd"]},
                    "enrichment": {"budget": "5s", "prometheus": {"url": prometheus.url, "history": "2m"}},
                    "incidents": {"settle": "3s"},
                    "outbox": {"initial_backoff": "50ms", "max_backoff": "200ms"},
                }
                async with running_bot(tmp_path, config) as bot:
                    am = Alertmanager(tmp_path / "am", shipped_alertmanager_config(bot.url))
                    try:
                        alert_to(prometheus, am.url)
                        await eventually(lambda: scraped(prometheus), timeout=30)
                        warm_inlet(fleet, HOT)  # the inlet air warms first
                        first = await eventually(lambda: card_of(slack, "Facility cooling"), timeout=45)
                        overheat(fleet, HOT, GPUS)
                        xid_burst(fleet, BURST)
                        ecc_sample(fleet)
                        await eventually(lambda: _settled(slack, pagerduty), timeout=90)
                        mailed = await eventually(lambda: _threads(mails.received(), 3), timeout=30)
                    finally:
                        am.stop()
    finally:
        prometheus.stop()

    # The first card, from the inlet alerts alone, already names the cause and the place.
    assert "Facility cooling" in first.rendered_text()

    # Slack: three cards; alone, only the first few alerts of each, told before there was an incident to join.
    assert len(cards(slack)) == 3
    alone = [m for m in slack.top_level() if m not in cards(slack)]
    assert len(alone) <= 3 * 5, [m.rendered_text()[:80] for m in alone]
    cooling = _card_text(slack, "Facility cooling")
    counts = re.search(r"Alerts:\*? ([^\n]+)", cooling)
    assert counts is not None
    named = counts.group(1)
    for alertname in ("InletTemperatureHigh", "GPUTempCritical", "GPUMemoryTempHigh", "GPUThermalThrottling"):
        assert alertname in named, named
    assert "GPUMemoryTempHigh 24" in named  # its warning and critical alerts of 24 GPUs, once each
    # Every figure against the fleet: 12 of 48 hosts, 24 of 96 GPUs; row C on 12 of 12, 12 of the fleet's 48.
    assert "12 of 48 hosts, 24 of 96 GPUs" in cooling
    assert '12 of 12 affected hosts have `row="C"`, against 12 of the fleet\'s 48 hosts' in cooling
    assert sum("Facility cooling" in card.rendered_text() for card in cards(slack)) == 1
    assert "Found among" not in cooling
    assert 'row="D"' not in cooling and "Xid" not in cooling
    xid = _card_text(slack, "GPUXIDError")
    assert "8 of 48 hosts" in xid
    ecc = _card_text(slack, "GPUECCUncorrectable")
    assert "6 of 48 hosts" in ecc and "Nothing stands out" in ecc and "Likely cause:* none" in ecc

    # PagerDuty: three incidents, the cooling one naming every host of row C; the alerts paged before their
    # incident formed are resolved into it: one open alert per cause on the responder's phone.
    assert len(incident_pages(pagerduty)) == 3
    await eventually(lambda: _only_incidents_open(pagerduty), timeout=30)
    assert _every_host_paged(pagerduty) == ", ".join(sorted(HOT))

    # Mail: three incident threads; the cooling one's digest names the alerts that joined on its hosts.
    incident_mails = [m for m in mailed if "INCIDENT" in m["Subject"]]
    assert len({_root(m) for m in incident_mails}) == 3
    cooling_mails = [_text(m) for m in incident_mails if "Facility cooling" in m["Subject"] or "Inlet" in m["Subject"]]
    assert any("GPUTempCritical" in text for text in cooling_mails)


def _settled(slack: FakeSlack, pagerduty: FakePagerDuty) -> bool:
    """Three cards, the cooling one read from all of its hosts and counting every alert of each alertname, the
    burst's its 8 hosts and the sample's its 6 (the incidents are told side by side: one may settle before
    another); three PagerDuty alerts, the cooling one's last naming every host of the row."""
    words = ("Facility cooling", "GPUXIDError", "GPUECCUncorrectable")
    cooling, burst, sample = (card_of(slack, word) for word in words)
    if len(cards(slack)) != 3 or cooling is None or burst is None or sample is None:
        return False
    if len(incident_pages(pagerduty)) != 3 or "6 of 48 hosts" not in sample.rendered_text():
        return False
    if _every_host_paged(pagerduty) != ", ".join(sorted(HOT)):
        return False
    text = cooling.rendered_text()
    every = ("GPUMemoryTempHigh 24", "GPUTempCritical 12", "GPUThermalThrottling 12", "InletTemperatureHigh 12")
    settled = all(count in text for count in every) and "12 of 48 hosts" in text and "Found among" not in text
    return settled and "8 of 48 hosts" in burst.rendered_text()


def _every_host_paged(pagerduty: FakePagerDuty) -> str:
    """The hosts the cooling incident's last trigger names (updates that only add hosts are paced: it may come
    after the card has settled)."""
    triggers = [t for t in pagerduty.accepted("trigger") if "Facility cooling" in t["payload"]["summary"]]
    return str(triggers[-1]["payload"]["custom_details"]["every_host"]) if triggers else ""


def _card_text(slack: FakeSlack, word: str) -> str:
    card = card_of(slack, word)
    assert card is not None, [m.rendered_text()[:80] for m in cards(slack)]
    return card.rendered_text()


def _root(mail: Any) -> str:
    return str(mail.get("In-Reply-To") or mail["Message-ID"])


def _text(mail: Any) -> str:
    part = mail.get_body(preferencelist=("plain",))
    return str(part.get_content()) if part is not None else ""


def _threads(received: list[Any], count: int) -> list[Any] | None:
    mails = [m.mail for m in received]
    threads = {_root(m) for m in mails if "INCIDENT" in m["Subject"]}
    return mails if len(threads) >= count else None


def _only_incidents_open(pagerduty: FakePagerDuty) -> bool:
    current = {key: pagerduty.current(key) for key in pagerduty.alerts}
    return all((alert is not None and alert.status == "resolved") == (not key.startswith("incident:"))
               for key, alert in current.items())  # fmt: skip

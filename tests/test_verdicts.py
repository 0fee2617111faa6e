"""Verdicts drive the message: a stale Xid gauge is told first (title, first line, shown severity, steps,
escalation), a fresh Xid reads as before, and a verdict that could not be reached says why in the same place.
The Value line says what the alert's number measures, and is left out where that number misleads."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.compose import compose_message
from bot.enrich.xid import STALE_GAUGE_TEXT, XidEnricher
from bot.evidence import Enrichment, EnrichmentSection, Verdict
from bot.gpu.xid_catalog import XidCatalog, load_catalog
from bot.message import Message
from bot.models import AlertState, Event, EventKind
from bot.playbooks import Evidence, PlaybookSet
from bot.render.email import render_email
from bot.render.pagerduty import pagerduty_event
from bot.render.slack import slack_payload
from bot.verdict import STALE_XID_GAUGE, verdicts_of
from tests.support.processes import REPO
from tests.test_pagerduty import ROUTING_KEY, receiver
from tests.test_xid_enricher import (
    GPU_LABELS,
    T0,
    Static,
    alert_state,
    at,
    loki_down,
    loki_section,
    prometheus_section,
    run,
    series,
)

PLAYBOOKS = PlaybookSet.load(REPO / "playbooks")
XID_79 = {**GPU_LABELS, "err_code": "79", "severity": "critical", "instance": "k-ai-01:9400"}
FATAL_WORDS = ("drain", "reset", "power-cycle", "reboot")


@pytest.fixture(scope="module")
def catalog() -> XidCatalog:
    return load_catalog()


async def message_for(alert: AlertState, enrichment: Enrichment) -> Message:
    advice = PLAYBOOKS.advise(PLAYBOOKS.match(alert), alert, enrichment)
    return compose_message(Event(id=1, kind=EventKind.FIRING, created_at=T0, alert=alert), enrichment, advice)


def steps(message: Message) -> list[str]:
    return next(s.lines for s in message.sections if s.title == "Runbook")


def escalation(message: Message) -> str:
    return next(s.lines[0] for s in message.sections if s.title == "Escalate")


async def stale(catalog: XidCatalog, alert: AlertState) -> Enrichment:
    quiet = loki_section([(at(-100), "NVRM: Xid (PCI:0000:86:00): 13, pid=7, name=x, Graphics Exception")])
    return await run(
        alert,
        Static(quiet),
        Static(prometheus_section(related={"xid_gauge": series([79] * 30)})),
        XidEnricher(catalog),
    )


async def test_a_stale_gauge_is_told_first_and_shown_as_info(catalog: XidCatalog) -> None:
    alert = alert_state(XID_79)
    message = await message_for(alert, await stale(catalog, alert))

    assert message.title == "GPUXIDError on k-ai-01 GPU 3: probably a stale gauge, no Xid in the kernel log"
    assert message.summary.splitlines()[0] == STALE_GAUGE_TEXT
    assert (message.severity, message.alert_severity) == ("info", "critical")
    assert message.labels == alert.labels and alert.labels["severity"] == "critical"
    assert next(f.value for f in message.facts if f.label == "Severity") == "info (the alert says critical)"
    runbook = steps(message)
    assert runbook[0].startswith("Check whether the Xid still recurs")
    assert "docker compose restart dcgm-exporter" in runbook[1]
    stale_advice = runbook[:3]
    assert not any(word in step.lower() for step in stale_advice for word in FATAL_WORDS)
    fatal = [step for step in runbook if "power-cycle" in step]
    assert fatal == [
        "Only if new NVRM Xid lines appear for GPU 3 in the kernel log: For Xid 79 (fallen off the bus) drain the "
        "node and power-cycle it (a warm reboot often does not bring the GPU back), then check PCIe seating, riser, "
        "power cables and the PSUs"
    ]
    assert escalation(message).startswith("Nothing to escalate while the kernel log has no new Xid line")


async def test_a_fresh_kernel_line_keeps_the_fatal_xid_message(catalog: XidCatalog) -> None:
    alert = alert_state(XID_79)
    fresh = loki_section([(at(-5), "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.")])
    gauge = Static(prometheus_section(related={"xid_gauge": series([79] * 30)}))
    enrichment = await run(alert, Static(fresh), gauge, XidEnricher(catalog))
    message = await message_for(alert, enrichment)

    assert verdicts_of(enrichment) == []
    assert message.title == "GPUXIDError on k-ai-01 GPU 3"
    assert (message.severity, message.alert_severity) == ("critical", "critical")
    assert next(f.value for f in message.facts if f.label == "Severity") == "critical"
    assert steps(message)[0].startswith("Read every Xid of the last hour")
    assert steps(message) == steps(await message_for(alert, Enrichment()))
    assert escalation(message).startswith("Escalate at once for Xid 48, 64, 79")


async def test_without_the_kernel_log_the_title_says_staleness_cannot_be_told(catalog: XidCatalog) -> None:
    alert = alert_state(XID_79)
    gauge = Static(prometheus_section(related={"xid_gauge": series([79] * 30)}))
    message = await message_for(alert, await run(alert, Static(loki_down()), gauge, XidEnricher(catalog)))

    assert message.title == (
        "GPUXIDError on k-ai-01 GPU 3: Xid gauge unchanged since before the alert, stale or fresh cannot be told "
        "(no kernel log)"
    )
    assert message.summary.splitlines()[0] == (
        "DCGM_FI_DEV_XID_ERRORS has not changed over the window; whether it is stale cannot be told without the "
        "kernel log (cannot reach Loki at http://127.0.0.1:1)"
    )
    assert message.severity == "critical"  # not judged stale: nothing is lowered
    assert steps(message)[0].startswith("Read every Xid of the last hour")


async def test_a_kernel_log_cut_at_lokis_limit_is_said_in_the_title(catalog: XidCatalog) -> None:
    alert = alert_state(XID_79)
    cut = loki_section([(at(-1), "NVRM: Xid (PCI:0000:86:00): 13, pid=7, name=x, Graphics Exception")], True)
    gauge = Static(prometheus_section(related={"xid_gauge": series([79] * 30)}))
    message = await message_for(alert, await run(alert, Static(cut), gauge, XidEnricher(catalog)))
    assert message.title.endswith("stale or fresh cannot be told (kernel log cut at Loki's line limit)")
    assert message.summary.splitlines()[0].endswith("(Loki's answer was cut at its line limit)")
    assert message.severity == "critical"


async def test_a_stale_gauge_silences_the_xid_79_power_judgement(catalog: XidCatalog) -> None:
    alert = alert_state(XID_79)
    enrichment = await stale(catalog, alert)
    related = EnrichmentSection(
        name="related",
        title="Related alerts",
        status="ok",
        data={"alerts": [{"alertname": "PSUFailure", "offset_seconds": -300}]},
    )
    with_psu = Enrichment(sections=[*enrichment.sections, related])
    message = await message_for(alert, with_psu)
    assert not [s for s in message.sections if s.kind == "judgement"]
    fresh = Enrichment(sections=[s for s in with_psu.sections if s.name != "xid"])
    judged = await message_for(alert, fresh)
    assert any("power-supply alert" in line for s in judged.sections if s.kind == "judgement" for line in s.lines)


def write_playbook(directory: Path, text: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "Correlated.yaml").write_text(text)


def test_a_case_can_say_what_a_correlation_means(tmp_path: Path) -> None:
    write_playbook(
        tmp_path / "playbooks",
        """
match:
  alertname: GPUMissing
title: A GPU disappeared
steps:
  - text: Power-cycle the host
related_alerts:
  - DCGMExporterNoGPUs
cases:
  - when:
      - { related: DCGMExporterNoGPUs }
    say: the exporter lost its GPUs, GPU {gpu} did not fall off the bus
    severity: warning
    steps:
      - text: Restart the exporter
        command: docker compose restart dcgm-exporter
    own_steps_if: the exporter shows the other GPUs again
""",
    )
    playbooks = PlaybookSet.load(tmp_path / "playbooks")
    alert = alert_state({"gpu": "3"}).model_copy(update={"labels": {"alertname": "GPUMissing", "gpu": "3"}})
    related = EnrichmentSection(
        name="related",
        title="Related alerts",
        status="ok",
        data={"alerts": [{"alertname": "DCGMExporterNoGPUs", "offset_seconds": -60}]},
    )
    advice = playbooks.advise(playbooks.match(alert), alert, Enrichment(sections=[related]))
    assert advice.verdict == advice.verdict_line == "the exporter lost its GPUs, GPU 3 did not fall off the bus"
    assert (advice.severity, advice.steps) == (
        "warning",
        [
            "Restart the exporter: `docker compose restart dcgm-exporter`",
            "Only if the exporter shows the other GPUs again: Power-cycle the host",
        ],
    )
    plain = playbooks.advise(playbooks.match(alert), alert, Enrichment())
    assert (plain.verdict, plain.severity, plain.steps) == ("", None, ["Power-cycle the host"])


def test_a_case_without_steps_keeps_the_playbooks_own(tmp_path: Path) -> None:
    write_playbook(
        tmp_path / "playbooks",
        """
match:
  alertname: GPUMissing
title: A GPU disappeared
steps:
  - text: Power-cycle the host
cases:
  - when:
      - { label: gpu, equals: "3" }
    say: GPU 3 is the one on the flaky riser
""",
    )
    playbooks = PlaybookSet.load(tmp_path / "playbooks")
    alert = alert_state({"gpu": "3"}).model_copy(update={"labels": {"alertname": "GPUMissing", "gpu": "3"}})
    advice = playbooks.advise(playbooks.match(alert), alert, Enrichment())
    assert (advice.verdict, advice.severity, advice.steps) == (
        "GPU 3 is the one on the flaky riser",
        None,
        ["Power-cycle the host"],
    )


def test_a_verdict_condition_holds_only_for_its_own_verdict() -> None:
    stale_verdict = Verdict(name=STALE_XID_GAUGE, headline="stale", line="a stale gauge")
    evidence = Evidence(labels={}, series={}, related=[], verdicts=[stale_verdict])
    playbook = PLAYBOOKS.get("GPUXIDError")
    assert playbook is not None
    assert playbook.cases[0].holds(evidence)
    assert not playbook.cases[0].holds(Evidence(labels={}, series={}, related=[]))


def test_verdicts_of_reads_the_verdict_of_the_xid_section_that_answered() -> None:
    good = {"name": STALE_XID_GAUGE, "headline": "h", "line": "l"}
    answered = EnrichmentSection(name="xid", title="Xid", status="ok", data={"scope": "gpu", "verdict": good})
    assert verdicts_of(Enrichment(sections=[answered])) == [Verdict(name=STALE_XID_GAUGE, headline="h", line="l")]
    assert verdicts_of(Enrichment(sections=[answered.model_copy(update={"status": "skipped"})])) == []
    none = EnrichmentSection(name="xid", title="Xid", status="ok", data={"scope": "gpu", "verdict": None})
    assert verdicts_of(Enrichment(sections=[none])) == []
    # A malformed verdict no longer reaches a reader: the section holding it does not validate.
    with pytest.raises(ValidationError):
        EnrichmentSection(name="xid", title="X", status="ok", data={"scope": "gpu", "verdict": {"name": "x"}})


@pytest.mark.parametrize(
    ("meaning", "shown"),
    [
        ("", "93"),
        ("rate over 10m of DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "93 (rate over 10m of DCGM_FI_DEV_PCIE_REPLAY_COUNTER)"),
        (None, None),
    ],
)
async def test_the_value_line_says_what_it_measures_or_is_left_out(meaning: str | None, shown: str | None) -> None:
    alert = alert_state(XID_79)
    prometheus = EnrichmentSection(
        name="prometheus",
        title="Metric history",
        status="ok",
        data={"history": {"current_text": "93"}, "value_meaning": meaning},
    )
    message = await message_for(alert, Enrichment(sections=[prometheus]))
    assert next((f.value for f in message.facts if f.label == "Value"), None) == shown


def test_a_correlation_case_says_the_host_is_down_not_only_its_exporter() -> None:
    alert = alert_state({"job": "dcgm", "instance": "k-ai-01:9400"}).model_copy(
        update={"labels": {"alertname": "ExporterDown", "job": "dcgm", "instance": "k-ai-01:9400"}}
    )
    playbook = PLAYBOOKS.match(alert)
    node = {"related": {"node_up": {"current": 0}}}
    enrichment = Enrichment(sections=[EnrichmentSection(name="prometheus", title="P", status="ok", data=node)])
    advice = PLAYBOOKS.advise(playbook, alert, enrichment)
    assert advice.verdict.startswith("the whole host is down or unreachable, not only its exporter")
    assert advice.steps[0].startswith("Check the host's power state and console from its BMC")
    assert (
        advice.steps[-1]
        == "Only if the host answers again: Restart the exporter: `docker compose restart dcgm-exporter`"
    )
    up = {"related": {"node_up": {"current": 1}}}
    answered = Enrichment(sections=[EnrichmentSection(name="prometheus", title="P", status="ok", data=up)])
    assert PLAYBOOKS.advise(playbook, alert, answered).verdict == ""


async def test_every_sink_says_the_verdict_in_its_title_and_first_line(catalog: XidCatalog, tmp_path: Path) -> None:
    alert = alert_state(XID_79)
    message = await message_for(alert, await stale(catalog, alert))
    title = "GPUXIDError on k-ai-01 GPU 3: probably a stale gauge, no Xid in the kernel log"

    slack = slack_payload(message)
    assert slack["text"].startswith(f"🔵 [INFO] {title}: {STALE_GAUGE_TEXT}")
    assert slack["attachments"][0]["color"] == "#2E90FA"

    mail = render_email(message, "bot.example")
    assert title in mail.subject
    assert mail.text.splitlines()[0] == f"FIRING (info): {title}"
    assert mail.text.split("\n\n")[1].splitlines()[0] == STALE_GAUGE_TEXT

    page = pagerduty_event(message, receiver(tmp_path), ROUTING_KEY)["payload"]
    assert page["summary"].startswith(f"{title}: {STALE_GAUGE_TEXT}")
    assert page["severity"] == "critical"  # the alert's own, unless downgrade_on_verdict


def test_an_idle_vllm_server_is_told_as_idle_and_not_reset() -> None:
    labels = {"alertname": "GPUIdleDuringWork", "severity": "warning", "gpu": "1", "host": "k-ai-02"}
    alert = alert_state({}).model_copy(update={"labels": {**labels, "UUID": "GPU-1", "instance": "k-ai-02:9400"}})
    idle = {"related": {"vllm_active": {"current": 0}}}
    enrichment = Enrichment(sections=[EnrichmentSection(name="prometheus", title="P", status="ok", data=idle)])
    advice = PLAYBOOKS.advise(PLAYBOOKS.match(alert), alert, enrichment)
    assert (
        advice.verdict
        == "an idle vLLM server keeping its KV cache, not a hang (no request running or waiting on k-ai-02)"
    )
    assert advice.severity == "info"
    assert 'host="k-ai-02"' in advice.steps[0]
    fatal = [step for step in advice.steps if "nvidia-smi -r" in step or "Kill the job" in step]
    assert fatal and all(step.startswith("Only if requests are running or waiting") for step in fatal)
    busy = {"related": {"vllm_active": {"current": 3}}}
    working = Enrichment(sections=[EnrichmentSection(name="prometheus", title="P", status="ok", data=busy)])
    assert PLAYBOOKS.advise(PLAYBOOKS.match(alert), alert, working).severity is None

"""Playbooks: the shipped set covers every shipped rule, check-config catches broken ones with file and line,
templates are safe, and the seed's correlations come out as judgements."""

from __future__ import annotations

import shlex
import sqlite3
import subprocess
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot import deadman
from bot import selftest_label as selftest_marking
from bot.action_catalog import ACTIONS
from bot.commands.cli import main
from bot.compose import compose_message
from bot.config import StoreConfig, load_config
from bot.evidence import Enrichment, EnrichmentSection
from bot.models import AlertState, Event, EventKind
from bot.playbooks import (
    GENERIC,
    Playbook,
    PlaybookError,
    PlaybookSet,
    fill_command,
)
from bot.querytemplate import TemplateError, fill_query, query_template_problems
from bot.store import open_store
from tests.support.payloads import alert_state
from tests.support.processes import REPO, find_binary

PLAYBOOKS = REPO / "playbooks"
RULES = REPO / "config" / "rules"
BROKEN = REPO / "tests" / "fixtures" / "playbooks" / "broken"
EXAMPLE_CONFIG = REPO / "config" / "bot.example.yaml"
STARTED = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
# Alerts gpu-alert-bot raises itself (bot/deadman.py, the self-test's); they have playbooks but no Prometheus rule.
BOT_ALERTS = {deadman.ALERTNAME, deadman.MEMBER_ALERTNAME, selftest_marking.ALERTNAME}

DCGM = {
    "gpu": "3",
    "UUID": "GPU-5b3c2f8e-1a2b-4c3d-8e9f-0a1b2c3d4e5f",
    "pci_bus_id": "00000000:5D:00.0",
    "modelName": "NVIDIA GeForce RTX 5090",
    "Hostname": "k-ai-01",
    "host": "k-ai-01.lan",
    "instance": "k-ai-01.lan:9400",
    "job": "dcgm",
}


def alert(alertname: str, starts_at: datetime = STARTED, **labels: str) -> AlertState:
    return alert_state(
        {"alertname": alertname, "severity": "critical", **labels},
        starts_at=starts_at,
        fingerprint=alertname,
        key=f"{alertname}-{sorted(labels.items())}@{starts_at.isoformat()}",
        annotations={"summary": f"{alertname} fired"},
    )


def series(current: float) -> dict[str, Any]:
    return {"query": "q", "labels": {}, "values": [[0.0, current]], "current": current, "min": current}


def prometheus(**related: float) -> EnrichmentSection:
    return EnrichmentSection(
        name="prometheus",
        title="Metrics",
        status="ok",
        data={"expr": None, "history": None, "related": {n: series(v) for n, v in related.items()}, "gpus": []},
    )


def related_alerts(*found: tuple[str, float]) -> EnrichmentSection:
    alerts = [{"key": f"{name}@x", "alertname": name, "offset_seconds": offset} for name, offset in found]
    root = next((a["key"] for a in alerts if a["offset_seconds"] <= 0), None)
    return EnrichmentSection(name="related", title="Related alerts", status="ok", data={"alerts": alerts, "root": root})


@pytest.fixture(scope="module")
def shipped() -> PlaybookSet:
    return PlaybookSet.load(PLAYBOOKS, {"grafana_url": "https://grafana.example.com"})


def shipped_rules() -> list[dict[str, Any]]:
    rules = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(rule for rule in group["rules"] if "alert" in rule)
    return rules


# --- the shipped set --------------------------------------------------------------------------------
def test_every_shipped_alert_rule_has_its_own_playbook(shipped: PlaybookSet) -> None:
    rules = shipped_rules()
    assert len(rules) >= 30
    for rule in rules:
        labels = {k: v for k, v in rule.get("labels", {}).items() if k != "severity"}
        playbook = shipped.match(alert(rule["alert"], severity=rule["labels"]["severity"], **labels))
        assert playbook.name != GENERIC, f"no playbook for {rule['alert']}"
        assert playbook.match is not None and rule["alert"] in playbook.match.alertnames
        assert playbook.steps, playbook.name
        assert playbook.thresholds, playbook.name


def test_every_playbook_matches_a_shipped_rule_or_a_bot_alert(shipped: PlaybookSet) -> None:
    names = {rule["alert"] for rule in shipped_rules()} | BOT_ALERTS
    for playbook in shipped:
        if playbook.match is not None:
            assert set(playbook.match.alertnames) & names, playbook.name


@pytest.mark.parametrize("alertname", sorted(BOT_ALERTS))
def test_every_alert_the_bot_raises_itself_has_its_own_playbook(shipped: PlaybookSet, alertname: str) -> None:
    playbook = shipped.match(alert(alertname, replica="http://am-b:9093"))
    assert playbook.name == alertname
    assert playbook.steps and playbook.thresholds and playbook.causes


def test_a_cluster_member_missing_is_checked_at_the_members_own_url(shipped: PlaybookSet) -> None:
    missing = alert(deadman.MEMBER_ALERTNAME, severity="warning", replica="http://am-b:9093")
    advice = shipped.advise(shipped.match(missing), missing, Enrichment())
    assert advice.title == "Alertmanager http://am-b:9093 is out of its cluster - the alert path has no spare"
    steps = "\n".join(advice.steps)
    assert "http://am-b:9093/-/healthy" in steps and "http://am-b:9093/api/v2/status" in steps
    assert "--cluster" in steps and "9094" in steps and "docker compose logs" in steps


def test_label_matchers_pick_the_more_specific_playbook(shipped: PlaybookSet) -> None:
    assert shipped.match(alert("ExporterDown", job="dcgm", instance="k-ai-01.lan:9400")).name == "ExporterDown-dcgm"
    assert shipped.match(alert("ExporterDown", job="node", instance="k-ai-01.lan:9100")).name == "ExporterDown"
    assert shipped.match(alert("GPUXidError", **DCGM)).name == "GPUXIDError"


def test_an_alert_nobody_wrote_a_playbook_for_gets_the_generic_one(shipped: PlaybookSet) -> None:
    unknown = alert("SomethingNew", instance="k-ai-01.lan:9100")
    playbook = shipped.match(unknown)
    advice = shipped.advise(playbook, unknown, Enrichment())
    assert playbook.name == GENERIC
    assert advice.title == "SomethingNew"
    assert advice.meaning and advice.steps
    assert "playbooks/SomethingNew.yaml" in advice.meaning


def test_check_config_accepts_the_example_config_and_every_shipped_playbook(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE_CONFIG)]) == 0
    config = load_config(EXAMPLE_CONFIG)
    assert config.playbooks.dir.resolve() == PLAYBOOKS.resolve()


def test_every_shipped_query_is_promql_that_promtool_accepts(shipped: PlaybookSet, tmp_path: Path) -> None:
    values = {**DCGM, "name": "vllm", "mountpoint": "/", "device": "nvme0", "model_name": "m", "rule_group": "g"}
    values |= {"receiver": "slack-gpu", "kind": "unauthorized", "queue": "events"}  # the bot's own alerts
    rules = []
    for playbook in shipped:
        for name, template in playbook.queries.items():
            query = fill_query(template, values)
            rules.append({"record": f"check:{playbook.name.replace('-', '_')}:{name}", "expr": query})
    assert len(rules) > 50
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "playbook-queries", "rules": rules}]}))
    result = subprocess.run(
        [find_binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_xid_and_vllm_playbooks_define_the_queries_other_enrichers_use(shipped: PlaybookSet) -> None:
    xid = shipped.match(alert("GPUXIDError", **DCGM))
    assert {"xid_gauge", "temperature", "power"} <= set(xid.queries)
    backlog = shipped.match(alert("vLLMQueueBacklog", instance="k-ai-01.lan:8000", host="k-ai-01.lan"))
    assert {"waiting", "gpu_util"} <= set(backlog.queries)


@pytest.mark.parametrize(
    ("alertname", "labels", "expected"),
    [
        ("GPUTempCritical", DCGM, ["87 °C", "5090", "90 °C", "80 °C"]),
        ("GPUPowerEnvelopeExceeded", DCGM, ["590 W", "575 W"]),
        ("GPUIdleDuringWork", DCGM, ["< 5 %", "1 GiB", "10 min"]),
        ("GPUECCUncorrectable", DCGM, ["no delay"]),
        ("HostMemoryLow", {"instance": "k-ai-01.lan:9100"}, ["5 %", "2 min"]),
        ("vLLMQueueBacklog", {"instance": "k-ai-01.lan:8000"}, ["> 10", "90 %"]),
        ("NVMeSpareLow", {"device": "nvme0"}, ["20 %"]),
        ("NVMeWearHigh", {"device": "nvme0"}, ["80 %"]),
        ("GPUThermalThrottling", DCGM, ["83 °C", "DCGM_FI_DEV_THERMAL_VIOLATION"]),
    ],
)
def test_thresholds_carry_the_seeds_numbers_and_reasoning(
    shipped: PlaybookSet, alertname: str, labels: dict[str, str], expected: list[str]
) -> None:
    firing = alert(alertname, **labels)
    advice = shipped.advise(shipped.match(firing), firing, Enrichment())
    text = "\n".join(advice.thresholds)
    for needle in expected:
        assert needle in text, f"{alertname}: {needle!r} missing from {text!r}"


def test_steps_carry_commands_filled_with_the_alerts_labels(shipped: PlaybookSet) -> None:
    firing = alert("GPUThermalThrottling", **DCGM)
    steps = shipped.advise(shipped.match(firing), firing, Enrichment()).steps
    assert any("`nvidia-smi -q -d PERFORMANCE -i 3`" in step for step in steps)
    xid = alert("GPUXIDError", **DCGM)
    xid_steps = shipped.advise(shipped.match(xid), xid, Enrichment()).steps
    assert any("journalctl -k" in step and "NVRM" in step for step in xid_steps)


# --- broken playbooks: file and line -----------------------------------------------------------------
def test_broken_playbooks_are_reported_with_file_and_line() -> None:
    with pytest.raises(PlaybookError) as caught:
        PlaybookSet.load(BROKEN)
    problems = caught.value.problems
    expected = [
        ("unknown_action.yaml:6: actions[1]", "unknown action 'reboot-everything'"),
        ("unknown_action.yaml:8: actions[2].safety", "reset-gpu is dangerous; a playbook cannot make it safe"),
        ("bad_query.yaml:6: queries.outside", "placeholder {gpu} outside a double-quoted string"),
        ("bad_query.yaml:7: queries.unbalanced", "unclosed '('"),
        ("bad_query.yaml:8: queries.filter", "'{gpu|regex}' is not a placeholder"),
        ("bad_query.yaml:9: queries.range", "[5 minutes] is not a range"),
        ("unknown_key.yaml:6: steps[0].comand", "unknown key"),
        ("unknown_key.yaml:7: runbok", "unknown key"),
        ("bad_judgement.yaml:10: judgements[0].when[0].series", "no query named 'gpu_util'"),
        ("bad_judgement.yaml:16: judgements[1].when[1].any[1].related", "'OOMKillerFired' is not in related_alerts"),
        ("bad_condition.yaml:6: judgements[0].when[0]", "give exactly one of above, below"),
        ("bad_condition.yaml:9: judgements[1].when[0]", "one of the keys series, label, related, verdict, any"),
        ("bad_case.yaml:6: cases[0].when[0].verdict", "unknown verdict 'gauge_feels_old' (known: stale_xid_gauge"),
        ("bad_case.yaml:10: cases[1].severity", "expected 'critical', 'warning' or 'info', not 'low'"),
        ("bad_steps_from.yaml:7: cases[0].steps_from", "no playbook named 'NoSuchPlaybook'"),
        ("bad_steps_from.yaml:8: cases[0].own_steps_if", "stray '{' at column 19"),
        ("bad_text.yaml:3: title", "stray '{' at column 5"),
        ("bad_text.yaml:6: steps[0].command", "stray '{'"),
        ("bad_link.yaml:6: links[0].url", "a link starts with http(s)://"),
        ("duplicate_key.yaml:4: title", "duplicate key 'title'"),
        ("bad_yaml.yaml:5:", "expected the node content"),
        ("no_match.yaml:1:", "a playbook needs `match"),
        ("same_match_2.yaml:1: match", "same_match_1.yaml already matches Overlap"),
    ]
    for where, what in expected:
        assert any(f"{BROKEN}/{where}" in p and what in p for p in problems), f"{where} {what}\n" + "\n".join(problems)
    assert len(problems) == len(expected) + 1  # bad_text's command has a stray '}' too


def test_check_config_fails_on_a_broken_playbook_and_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "GPUTempCritical.yaml").write_text(
        "match:\n  alertname: GPUTempCritical\ntitle: Hot\nactions:\n  - ack\n  - drain-everything\n"
    )
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"playbooks": {"dir": str(playbooks)}}))
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{playbooks}/GPUTempCritical.yaml:6: actions[1]: unknown action 'drain-everything'" in err


def test_the_action_registry_names_each_action_with_its_safety_class(shipped: PlaybookSet) -> None:
    assert ACTIONS["ack"].safety == "safe"
    assert ACTIONS["silence-1h"].safety == "safe"
    assert ACTIONS["restart-dcgm-exporter"].safety == "guarded"
    assert ACTIONS["drain-node"].safety == "dangerous"
    firing = alert("GPUXIDError", **DCGM)
    actions = {a.name: a.safety for a in shipped.advise(shipped.match(firing), firing, Enrichment()).actions}
    assert actions["ack"] == "safe"
    assert actions["restart-dcgm-exporter"] == "guarded"
    assert actions["reboot-node"] == "dangerous"


def test_a_playbook_may_make_an_action_stricter(tmp_path: Path) -> None:
    (tmp_path / "X.yaml").write_text(
        "match: {alertname: X}\ntitle: X\nactions:\n  - {name: restart-dcgm-exporter, safety: dangerous}\n"
    )
    playbooks = PlaybookSet.load(tmp_path)
    firing = alert("X")
    assert playbooks.advise(playbooks.match(firing), firing, Enrichment()).actions[0].safety == "dangerous"


# --- templates --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "template",
    [
        'DCGM_FI_DEV_GPU_TEMP{instance="{instance}", gpu="{gpu}"}',
        'max(DCGM_FI_DEV_GPU_UTIL{host="{host}"})',
        'histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{job="{job}"}[5m])))',
        'max_over_time(DCGM_FI_DEV_GPU_TEMP{instance="{instance}"}[1d:5m])',
        'smartctl_device_available_spare{device=~"nvme[0-9]{1,2}"}',
        'ipmi_temperature_celsius{host="{host}", name=~"(?i).*(inlet|ambient).*"}',
    ],
)
def test_good_query_templates_pass(template: str) -> None:
    assert query_template_problems(template) == []


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("", "empty query"),
        ("x{gpu={gpu}}", "outside a double-quoted string"),
        ("x{gpu='{gpu}'}", "in a '-quoted string"),
        ('x{gpu="{gpu"}', "is not a placeholder"),
        ('x{gpu="{ gpu }"}', "is not a placeholder"),
        ('x{gpu="{gpu}"', "unclosed '{'"),
        ('sum(x{gpu="{gpu}"}))', "unbalanced ')'"),
        ("rate(x[5 m])", "is not a range"),
        ("x{gpu=3}", "is not a selector"),
        ('x{gpu="3}', "unterminated string"),
    ],
)
def test_bad_query_templates_are_refused(template: str, problem: str) -> None:
    problems = query_template_problems(template)
    assert problems and problem in problems[0], problems


def test_query_values_are_escaped_for_their_string_and_regex_escaped_after_tilde() -> None:
    values = {"instance": 'k"ai\\01', "host": "k-ai-01.lan"}
    assert fill_query('x{instance="{instance}"}', values) == 'x{instance="k\\"ai\\\\01"}'
    assert fill_query('x{instance=~"{host}:.*"}', values) == 'x{instance=~"k-ai-01\\\\.lan:.*"}'
    with pytest.raises(TemplateError, match="no label gpu"):
        fill_query('x{gpu="{gpu}"}', values)


@pytest.mark.parametrize("value", ["0; rm -rf /", "$(reboot)", "`id`", "0' || true '", "-r", "a b", ""])
def test_commands_never_take_a_label_value_that_is_not_a_plain_word(value: str) -> None:
    assert fill_command("nvidia-smi -q -i {gpu}", {"gpu": value}) == "nvidia-smi -q -i <gpu>"


def test_commands_take_plain_label_values() -> None:
    assert fill_command("docker logs --tail 100 {name}", {"name": "vllm-llama_3.1"}) == (
        "docker logs --tail 100 vllm-llama_3.1"
    )


def test_links_use_configured_variables_and_percent_encode_label_values(shipped: PlaybookSet) -> None:
    firing = alert("GPUTempCritical", **{**DCGM, "instance": "k-ai-01.lan:9400&x=<y>"})
    links = {link.text: link.url for link in shipped.advise(shipped.match(firing), firing, Enrichment()).links}
    url = links["GPU dashboard (Grafana 12239)"]
    assert url.startswith("https://grafana.example.com/d/Oxed_c6Wz/nvidia-dcgm-exporter-dashboard?")
    assert "var-instance=k-ai-01.lan%3A9400%26x%3D%3Cy%3E&var-gpu=3" in url
    start_ms = int((STARTED - timedelta(hours=1)).timestamp() * 1000)
    assert f"from={start_ms}&" in url
    assert "/d/rYdddlPWk/node-exporter-full?var-node=k-ai-01.lan:9100" in links["Host dashboard (Grafana 1860)"]
    assert "Site runbook" not in links  # runbook_base_url is not configured


def test_links_whose_base_is_not_configured_are_left_out_and_vars_override_the_defaults() -> None:
    variables = {"runbook_base_url": "https://wiki.example.com/gpu", "dcgm_dashboard_uid": "abc"}
    playbooks = PlaybookSet.load(PLAYBOOKS, variables)
    firing = alert("GPUTempCritical", **DCGM)
    links = {link.text: link.url for link in playbooks.advise(playbooks.match(firing), firing, Enrichment()).links}
    assert links == {"Site runbook": "https://wiki.example.com/gpu/GPUTempCritical"}
    with_grafana = PlaybookSet.load(PLAYBOOKS, {"grafana_url": "http://g", "dcgm_dashboard_uid": "abc"})
    urls = [link.url for link in with_grafana.advise(with_grafana.match(firing), firing, Enrichment()).links]
    assert urls[0].startswith("http://g/d/abc/")


# --- judgements: the seed's correlations, as data -----------------------------------------------------
BOTTLENECK = "the bottleneck is the tokenizer or the scheduler, not compute"


def backlog_advice(shipped: PlaybookSet, *sections: EnrichmentSection) -> list[str]:
    firing = alert("vLLMQueueBacklog", instance="k-ai-01.lan:8000", host="k-ai-01.lan", model_name="llama")
    return shipped.advise(shipped.match(firing), firing, Enrichment(sections=list(sections))).judgements


def test_a_vllm_backlog_with_idle_gpus_is_a_tokenizer_or_scheduler_bottleneck(shipped: PlaybookSet) -> None:
    judgements = backlog_advice(shipped, prometheus(waiting=14, gpu_util=42.5))
    assert len(judgements) == 1
    assert judgements[0].startswith("14 requests are queued while the busiest GPU of this host is only 42.5 % busy")
    assert BOTTLENECK in judgements[0]


def test_a_vllm_backlog_with_busy_gpus_is_not_a_bottleneck_but_demand(shipped: PlaybookSet) -> None:
    judgements = backlog_advice(shipped, prometheus(waiting=14, gpu_util=97))
    assert not any(BOTTLENECK in j for j in judgements)
    assert judgements == [
        "The GPUs are saturated (97 %): the queue is real demand beyond capacity. Add replicas or shed load."
    ]


def test_no_judgement_without_the_evidence(shipped: PlaybookSet) -> None:
    assert backlog_advice(shipped) == []
    assert backlog_advice(shipped, prometheus(waiting=14)) == []
    unavailable = EnrichmentSection.unavailable("prometheus", "Metrics", "timeout")
    assert backlog_advice(shipped, unavailable) == []


def test_a_full_kv_cache_is_called_out(shipped: PlaybookSet) -> None:
    judgements = backlog_advice(shipped, prometheus(waiting=30, gpu_util=99, kv_cache_usage=0.98))
    assert any("The KV cache is full (0.98 of it used)" in j for j in judgements)


def test_an_idle_gpu_holding_memory_is_judged_a_likely_cuda_hang(shipped: PlaybookSet) -> None:
    firing = alert("GPUIdleDuringWork", **DCGM)
    judgements = shipped.advise(shipped.match(firing), firing, Enrichment()).judgements
    assert judgements == [
        "Likely a CUDA hang: GPU 3 holds its memory but has done almost no work for 10 minutes, "
        "and the application will not notice by itself."
    ]
    idle_server = Enrichment(sections=[prometheus(vllm_active=0)])
    judgements = shipped.advise(shipped.match(firing), firing, idle_server).judgements
    assert not any("CUDA hang" in j for j in judgements)
    assert any("idle inference server" in j for j in judgements)


def test_an_oom_kill_and_a_restart_loop_are_one_incident(shipped: PlaybookSet) -> None:
    restarts = alert("ContainerRestartLoop", instance="k-ai-01.lan:8080", name="vllm")
    enrichment = Enrichment(sections=[related_alerts(("OOMKillerFired", -180))])
    judgements = shipped.advise(shipped.match(restarts), restarts, enrichment).judgements
    assert any("The OOM killer fired on this host before the restarts: one incident." in j for j in judgements)
    oom = alert("OOMKillerFired", instance="k-ai-01.lan:9100")
    enrichment = Enrichment(sections=[related_alerts(("ContainerRestartLoop", 120))])
    judgements = shipped.advise(shipped.match(oom), oom, enrichment).judgements
    assert any("the OOM kill and the restarts are one incident" in j for j in judgements)


def test_a_psu_voltage_drop_before_an_xid_79_points_at_power(shipped: PlaybookSet) -> None:
    xid = alert("GPUXIDError", **DCGM, err_code="79")
    psu_before = Enrichment(sections=[related_alerts(("PSUVoltageDrop", -240))])
    judgements = shipped.advise(shipped.match(xid), xid, psu_before).judgements
    assert any("fell off the bus for lack of power" in j for j in judgements)
    # After the Xid, or before another Xid, it says nothing about power.
    psu_after = Enrichment(sections=[related_alerts(("PSUVoltageDrop", 240))])
    assert not any("power" in j for j in shipped.advise(shipped.match(xid), xid, psu_after).judgements)
    other = alert("GPUXIDError", **DCGM, err_code="13")
    assert not any("power" in j for j in shipped.advise(shipped.match(other), other, psu_before).judgements)
    # dcgm-exporter without the err_code label: the gauge's current value says 79.
    bare = alert("GPUXIDError", **DCGM)
    gauge = Enrichment(sections=[prometheus(xid_gauge=79), related_alerts(("PSUFailure", -60))])
    assert any("lack of power" in j for j in shipped.advise(shipped.match(bare), bare, gauge).judgements)


@pytest.mark.parametrize(
    ("code", "drain"),
    [("79", True), ("48", True), ("94", False), ("95", True), ("119", True), ("120", True), ("154", True)],
)
def test_each_xid_that_takes_the_node_out_of_service_says_drain_and_resume(
    shipped: PlaybookSet, code: str, drain: bool
) -> None:
    xid = alert("GPUXIDError", **DCGM, err_code=code)
    advice = shipped.advise(shipped.match(xid), xid, Enrichment())
    [said] = [j for j in advice.judgements if j.startswith(f"Xid {code}") or j.startswith("Xid 119/120")]
    assert ("(on Slurm: DRAIN with this alert's id" in said) is drain
    assert ("Resume node" in said) is drain
    assert {"drain-node", "resume-node"} <= {action.name for action in advice.actions}
    # From the gauge alone (no err_code label) too.
    bare = alert("GPUXIDError", **DCGM)
    gauge = Enrichment(sections=[prometheus(xid_gauge=float(code))])
    assert said in shipped.advise(shipped.match(bare), bare, gauge).judgements


def test_related_conditions_respect_their_window(tmp_path: Path) -> None:
    (tmp_path / "X.yaml").write_text(
        "match: {alertname: X}\ntitle: X\nrelated_alerts: [{alert: Y, within: 1h}]\n"
        "judgements:\n  - when: [{related: Y, within: 5m, order: before}]\n    say: close\n"
    )
    playbooks = PlaybookSet.load(tmp_path)
    firing = alert("X")

    def said(offset: float) -> list[str]:
        enrichment = Enrichment(sections=[related_alerts(("Y", offset))])
        return playbooks.advise(playbooks.match(firing), firing, enrichment).judgements

    assert said(-120) == ["close"]
    assert said(-600) == []
    assert said(120) == []


def test_compose_renders_thresholds_judgement_and_runbook(shipped: PlaybookSet) -> None:
    firing = alert("vLLMQueueBacklog", instance="k-ai-01.lan:8000", host="k-ai-01.lan", model_name="llama")
    enrichment = Enrichment(sections=[prometheus(waiting=14, gpu_util=40)])
    advice = shipped.advise(shipped.match(firing), firing, enrichment)
    message = compose_message(Event(id=1, kind=EventKind.FIRING, created_at=STARTED, alert=firing), enrichment, advice)
    sections = {section.title: section for section in message.sections}
    assert sections["Judgement"].kind == "judgement"
    assert BOTTLENECK in sections["Judgement"].lines[0]
    assert any("vllm:num_requests_waiting > 10 for 5 min" in line for line in sections["Thresholds"].lines)
    assert sections["Runbook"].kind == "steps"
    assert [a.name for a in message.actions] == ["ack", "silence-1h", "restart-inference-server"]


def test_a_blank_summary_annotation_gives_way_to_the_next_one(shipped: PlaybookSet) -> None:
    firing = alert("GPUXIDError", **DCGM).model_copy(
        update={"annotations": {"summary": " \n ", "description": " Xid 79 on GPU 3 "}}
    )
    advice = shipped.advise(shipped.match(firing), firing, Enrichment())
    message = compose_message(
        Event(id=1, kind=EventKind.FIRING, created_at=STARTED, alert=firing), Enrichment(), advice
    )
    assert message.summary == "Xid 79 on GPU 3"


def test_playbook_objects_keep_the_interface_the_pipeline_uses(shipped: PlaybookSet) -> None:
    playbook = shipped.match(alert("GPUXIDError", **DCGM))
    assert isinstance(playbook, Playbook)
    assert all(isinstance(t, str) for t in playbook.queries.values())
    assert {r.alert: r.within for r in playbook.related_alerts}["PSUVoltageDrop"] == 1800.0


def test_a_gpu_reset_comes_after_freeing_the_gpu_and_names_it_by_uuid(shipped: PlaybookSet) -> None:
    """nvidia-smi -r fails while dcgm-exporter (or anything else) holds the GPU, and an index can name another
    GPU after a renumbering: every reset step is preceded by stopping the exporter and checking the GPU is free."""
    resets = 0
    for playbook in shipped:
        for index, step in enumerate(playbook.steps):
            if "nvidia-smi -r" not in (step.command or ""):
                continue
            resets += 1
            assert "-i {UUID}" in (step.command or ""), playbook.name
            before = " ".join(f"{s.text} {s.command or ''}" for s in playbook.steps[:index])
            assert "docker compose stop dcgm-exporter" in before, playbook.name
            assert "--query-compute-apps=pid" in before and "noheader" in before, playbook.name
    assert resets >= 2


def test_the_dcgm_diagnostic_level_follows_the_gpu_class(shipped: PlaybookSet) -> None:
    def judgements(model: str) -> list[str]:
        firing = alert("GPUECCUncorrectable", **{**DCGM, "modelName": model})
        return shipped.advise(shipped.match(firing), firing, Enrichment()).judgements

    assert any("dcgmi diag -r 1 -i 3" in j for j in judgements("NVIDIA GeForce RTX 5090"))
    assert any("dcgmi diag -r 1" in j for j in judgements("NVIDIA RTX PRO 6000 Blackwell Server Edition"))
    assert not any("dcgmi diag" in j for j in judgements("NVIDIA H100 80GB HBM3"))


async def test_the_store_queries_in_the_bots_own_playbooks_run_on_the_real_schema_at_the_composed_path(
    shipped: PlaybookSet, tmp_path: Path
) -> None:
    """The sqlite3 steps of the GPUAlertBot* playbooks: the file is the compose volume's store, and each query
    runs on a store the bot created (a renamed column would otherwise only show during an incident)."""
    compose = yaml.safe_load((REPO / "config" / "docker-compose.yml").read_text())
    store_path = Path(yaml.safe_load((REPO / "config" / "bot.compose.yaml").read_text())["store"]["path"])
    [volume] = [v.split(":")[0] for v in compose["services"]["gpu-alert-bot"]["volumes"] if str(store_path.parent) in v]
    # `docker compose up` from config/ names the volume config_<name>.
    host_file = f"/var/lib/docker/volumes/config_{volume}/_data/{store_path.name}"
    store = await open_store(StoreConfig(path=tmp_path / "bot.db"))
    await store.close()
    values = {"receiver": "slack-gpu", "queue": "events", "instance": "gpu-alert-bot:9095"}
    queries = []
    for playbook in shipped:
        for step in playbook.steps if playbook.name.startswith("GPUAlertBot") else ():
            command = fill_command(step.command or "", values)
            if "sqlite3" in command:
                assert host_file in command, playbook.name
                queries.append((playbook.name, shlex.split(command)[-1]))
    assert len(queries) >= 4
    with closing(sqlite3.connect(f"file:{tmp_path / 'bot.db'}?mode=ro", uri=True)) as connection:
        for name, sql in queries:
            for statement in filter(str.strip, sql.split(";")):
                try:
                    connection.execute(statement).fetchall()
                except sqlite3.Error as exc:  # an unknown table or column
                    pytest.fail(f"{name}: {exc} in {statement}")

"""The shipped Prometheus rules: valid for promtool, and firing exactly at the seed's thresholds after their real
`for` (promtool simulates the time; fixtures in tests/fixtures/promtool/)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.metrics import WEBHOOK_REFUSALS, Metrics
from tests.support.processes import REPO, find_binary

RULES = REPO / "config" / "rules"
PROMTOOL_FIXTURES = REPO / "tests" / "fixtures" / "promtool"
SEED_GPU_RULES = {
    "GPUTempCritical": ("DCGM_FI_DEV_GPU_TEMP > 87", "30s", "critical"),
    "GPUThermalThrottling": ("rate(DCGM_FI_DEV_THERMAL_VIOLATION[5m]) > 0", "1m", "warning"),
    "GPUECCUncorrectable": ("increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0", None, "critical"),
    "GPUXIDError": ("increase(DCGM_FI_DEV_XID_ERRORS[5m]) > 0", None, "critical"),
    "GPUPowerEnvelopeExceeded": ("DCGM_FI_DEV_POWER_USAGE > 590", "5m", "warning"),
    "GPUIdleDuringWork": ("DCGM_FI_DEV_GPU_UTIL < 5 and DCGM_FI_DEV_FB_USED > 1024", "10m", "warning"),
    "HostMemoryLow": ("(node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes) < 0.05", "2m", "critical"),
    "OOMKillerFired": ("increase(node_vmstat_oom_kill[5m]) > 0", None, "critical"),
    # The seed's rate() could never fire; the rule counts cAdvisor's series instead (see the next tests).
    "ContainerRestartLoop": ('container_start_time_seconds{name!=""}[15m])) - 1 > 3', "10m", "warning"),
    "vLLMQueueBacklog": ("vllm:num_requests_waiting > 10", "5m", "warning"),
    "vLLMHighLatency": (
        "histogram_quantile(0.95, rate(vllm:e2e_request_latency_seconds_bucket[5m])) > 10",
        "5m",
        "warning",
    ),
}

# Rules beyond the seed's: GPU memory temperature and a temperature climbing towards GPUTempCritical.
NEW_GPU_RULES = {"GPUMemoryTempHigh", "GPUTemperatureRising"}

# The rules about gpu-alert-bot itself (monitoring-alerts.yml, group gpu-alert-bot).
BOT_RULES = {
    "GPUAlertBotDown",
    "GPUAlertBotWebhooksRefused",
    "GPUAlertBotDeliveriesFailing",
    "GPUAlertBotWorkSetAside",
    "GPUAlertBotDeliveriesRetrying",
}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_binary("promtool"), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def shipped_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(rule for rule in group["rules"] if "alert" in rule)
    return rules


def test_promtool_accepts_every_shipped_rule_file() -> None:
    files = sorted(RULES.glob("*.yml"))
    assert [f.name for f in files] == ["gpu-alerts.yml", "hardware-alerts.yml", "monitoring-alerts.yml"]
    result = promtool("check", "rules", *map(str, files))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_seed_rules_keep_their_expressions_durations_and_severities() -> None:
    by_name = {rule["alert"]: rule for rule in shipped_rules()}
    for name, (expression, duration, severity) in SEED_GPU_RULES.items():
        rule = by_name[name]
        assert expression in " ".join(rule["expr"].split()), name
        assert rule.get("for") == duration, name
        assert rule["labels"]["severity"] == severity, name
        assert rule["annotations"]["summary"], name
        assert rule["annotations"]["description"], name


def test_every_alert_rule_has_a_severity_and_a_summary() -> None:
    for rule in shipped_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info", "none"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_the_off_by_default_dcgm_counters_are_called_out() -> None:
    text = (RULES / "gpu-alerts.yml").read_text()
    for counter in ("DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"):
        assert f"Needs {counter} enabled in dcgm-exporter's CSV" in text


def _without_descriptions(source: Path, target: Path) -> None:
    """promtool compares annotations exactly; the fixtures check summaries, so the long descriptions go."""
    data = yaml.safe_load(source.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.get("annotations", {}).pop("description", None)
    target.write_text(yaml.safe_dump(data, allow_unicode=True))


@pytest.mark.parametrize("fixture", sorted(p.name for p in PROMTOOL_FIXTURES.glob("*.test.yml")))
def test_rules_fire_at_their_thresholds_after_their_for(fixture: str, tmp_path: Path) -> None:
    test_file = yaml.safe_load((PROMTOOL_FIXTURES / fixture).read_text())
    rule_files = []
    for relative in test_file["rule_files"]:
        source = (PROMTOOL_FIXTURES / relative).resolve()
        assert source.parent == RULES, relative
        _without_descriptions(source, tmp_path / source.name)
        rule_files.append(source.name)
    test_file["rule_files"] = rule_files
    (tmp_path / fixture).write_text(yaml.safe_dump(test_file, allow_unicode=True))
    result = promtool("test", "rules", fixture, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def assert_firing_and_silent_cases(fixture: str, alertnames: Iterable[str]) -> None:
    """Each alert has a promtool case where it fires and one where it stays silent."""
    tests = yaml.safe_load((PROMTOOL_FIXTURES / fixture).read_text())["tests"]
    for name in alertnames:
        cases = [case for test in tests for case in test.get("alert_rule_test", []) if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in cases), name
        assert any(not case["exp_alerts"] for case in cases), name


def test_each_gpu_rule_has_a_firing_and_a_non_firing_case() -> None:
    assert_firing_and_silent_cases("gpu-alerts.test.yml", [*SEED_GPU_RULES, *NEW_GPU_RULES])


def test_the_memory_temperature_rules_leave_out_the_exporters_unsupported_values() -> None:
    """0 (no memory sensor) is below any threshold; DCGM's blank (2147483632 and above) is above the bound."""
    rules = [rule for rule in shipped_rules() if rule["alert"] == "GPUMemoryTempHigh"]
    assert {rule["labels"]["severity"] for rule in rules} == {"warning", "critical"}
    for rule in rules:
        assert "DCGM_FI_DEV_MEMORY_TEMP < 200" in rule["expr"]


def test_each_rule_about_the_bot_has_a_firing_and_a_non_firing_case() -> None:
    groups = yaml.safe_load((RULES / "monitoring-alerts.yml").read_text())["groups"]
    [bot_group] = [group for group in groups if group["name"] == "gpu-alert-bot"]
    assert {rule["alert"] for rule in bot_group["rules"]} == BOT_RULES
    assert_firing_and_silent_cases("monitoring-alerts.test.yml", BOT_RULES)


def test_the_rules_about_the_bot_use_the_metrics_it_exports() -> None:
    exported = {family.name + ("_total" if family.type == "counter" else "") for family in Metrics().registry.collect()}
    used = set()
    for rule in shipped_rules():
        if rule["alert"] in BOT_RULES:
            used |= set(re.findall(r"\bgpu_alert_bot_\w+", rule["expr"]))
    assert len(used) >= 4
    assert used <= exported, used - exported


def test_the_refused_webhooks_rule_counts_every_refusal_the_bot_makes() -> None:
    [rule] = [rule for rule in shipped_rules() if rule["alert"] == "GPUAlertBotWebhooksRefused"]
    match = re.search(r'kind=~"([^"]+)"', rule["expr"])
    assert match is not None
    assert sorted(match.group(1).split("|")) == sorted(WEBHOOK_REFUSALS)


def cadvisor_restart_loop(runs: int, samples_per_run: int) -> list[dict[str, str]]:
    """What cAdvisor exports for a Docker container that its restart policy restarts: the container's creation
    time in every run (a restart keeps it), one series per run told apart by Docker's restart count (no label
    before the first restart), stale when the run ends."""
    labels = 'instance="k-ai-01.lan:8080", job="cadvisor", id="/system.slice/docker-3f9a1c.scope", name="vllm"'
    series = []
    for run in range(runs):
        restart_count = f', container_label_restartcount="{run}"' if run else ""
        before = f"_x{run * samples_per_run} " if run else ""
        # x(n-2) gives n-1 samples, then the stale marker fills the run's last slot; the last run keeps going.
        during = "1767225600x100" if run == runs - 1 else f"1767225600x{samples_per_run - 2} stale"
        series.append({"series": f"container_start_time_seconds{{{labels}{restart_count}}}", "values": before + during})
    return series


def test_neither_the_seeds_restart_loop_rule_nor_changes_can_see_cadvisors_restarts(tmp_path: Path) -> None:
    """Why ContainerRestartLoop counts series: with cAdvisor's real output (one series per run, each holding the
    same creation time), the seed's rate() and a changes() of the start time both stay silent while the container
    restarts every 30 s for 20 minutes; counting the series in the window gives the restarts."""
    rules = [
        {"alert": "SeedRestartLoop", "expr": "rate(container_start_time_seconds[15m]) > 3"},
        {"alert": "ChangesRestartLoop", "expr": "changes(container_start_time_seconds[15m]) > 3"},
    ]
    (tmp_path / "seed.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "seed", "interval": "30s", "rules": rules}]})
    )
    restarts_15m = 'count by (name) (last_over_time(container_start_time_seconds{name!=""}[15m])) - 1'
    (tmp_path / "seed.test.yml").write_text(
        yaml.safe_dump(
            {
                "rule_files": ["seed.yml"],
                "evaluation_interval": "30s",
                "tests": [
                    {
                        "interval": "15s",
                        "input_series": cadvisor_restart_loop(runs=41, samples_per_run=2),
                        "alert_rule_test": [
                            {"eval_time": "20m", "alertname": "SeedRestartLoop", "exp_alerts": []},
                            {"eval_time": "20m", "alertname": "ChangesRestartLoop", "exp_alerts": []},
                        ],
                        "promql_expr_test": [
                            {
                                "expr": restarts_15m,
                                "eval_time": "20m",
                                "exp_samples": [{"labels": '{name="vllm"}', "value": 30}],
                            }
                        ],
                    }
                ],
            }
        )
    )
    result = promtool("test", "rules", "seed.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

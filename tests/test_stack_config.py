"""The stack's configuration: Alertmanager (checked by amtool 0.25 and run for real), Prometheus (promtool), the
management-VM docker-compose file and the bot's configuration inside it."""

from __future__ import annotations

import ipaddress
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.commands.cli import listen_host
from bot.config import load_config
from bot.playbooks import PlaybookSet
from tests.support.bot import eventually, running_bot
from tests.support.processes import REPO, Alertmanager, find_binary

CONFIG = REPO / "config"
ALERTMANAGER = CONFIG / "alertmanager.example.yml"
PROMETHEUS = CONFIG / "prometheus.yml"
COMPOSE = CONFIG / "docker-compose.yml"
GPU_NODE_COMPOSE = CONFIG / "docker-compose.gpu-node.yml"
PROMTAIL = CONFIG / "promtail.gpu-node.yml"
BOT_IN_COMPOSE = CONFIG / "bot.compose.yaml"
SEED_JOBS = {
    "dcgm": ["k-ai-01.lan:9400", "k-ai-02.lan:9400"],
    "node": ["k-ai-01.lan:9100", "k-ai-02.lan:9100"],
    "ipmi": ["k-ai-01.lan:9290", "k-ai-02.lan:9290"],
    "smart": ["k-ai-01.lan:9633", "k-ai-02.lan:9633"],
    "vllm": ["k-ai-01.lan:8000"],
}
SECRET_WORDS = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|ROUTING_KEY", re.IGNORECASE)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60, check=False)


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


# --- Alertmanager -----------------------------------------------------------------------------------
def test_amtool_accepts_the_alertmanager_example() -> None:
    result = run(find_binary("amtool"), "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_everything_goes_to_the_bot_with_resolutions_and_a_bearer_token_file() -> None:
    config = load(ALERTMANAGER)
    assert config["route"]["receiver"] == "gpu-alert-bot"
    assert {r["receiver"] for r in config["route"]["routes"]} == {"gpu-alert-bot"}
    [receiver] = config["receivers"]
    [webhook] = receiver["webhook_configs"]
    assert webhook["url"] == "http://gpu-alert-bot:9095/alertmanager"
    assert webhook["send_resolved"] is True
    assert "timeout" not in webhook  # Alertmanager 0.25 rejects it
    assert webhook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/run/secrets/webhook_token",
    }
    bot = load(BOT_IN_COMPOSE)
    assert bot["server"]["auth"]["bearer_token_file"] == "/run/secrets/webhook_token"


def routes_for(*labels: str) -> str:
    result = run(find_binary("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER}", "--tree", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_watchdog_has_its_own_route_with_a_short_repeat_interval() -> None:
    assert '{alertname="Watchdog"}  receiver: gpu-alert-bot' in routes_for("alertname=Watchdog")
    assert "default-route  receiver: gpu-alert-bot" in routes_for("alertname=GPUTempCritical", "severity=critical")
    [watchdog] = [r for r in load(ALERTMANAGER)["route"]["routes"] if r["matchers"] == ['alertname="Watchdog"']]
    assert watchdog["repeat_interval"] == "1m"
    assert load(ALERTMANAGER)["route"]["repeat_interval"] == "4h"


def uncomment_receiver(text: str, name: str) -> str:
    """The example file with the commented-out route and receiver named `name` switched on."""
    lines: list[str] = []
    indent: str | None = None
    for line in text.splitlines():
        start = re.match(rf"^(\s*)# (- (?:receiver|name): {re.escape(name)})$", line)
        if start:
            indent = start.group(1)
            lines.append(indent + start.group(2))
        elif indent is not None and line.startswith(f"{indent}#   "):
            lines.append(indent + line[len(indent) + 2 :])
        else:
            indent = None
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_bots_own_alerts_can_reach_a_receiver_that_does_not_go_through_the_bot(tmp_path: Path) -> None:
    """GPUAlertBotDown cannot be delivered by the bot: the example routes the bot's alerts to the bot and, once
    the ops-email route and receiver are uncommented, to Alertmanager's own email as well."""
    alert = "alertname=GPUAlertBotDown"
    shipped = run(find_binary("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER}", alert)
    assert shipped.stdout.strip() == "gpu-alert-bot", shipped.stdout + shipped.stderr
    enabled = tmp_path / "alertmanager.yml"
    enabled.write_text(uncomment_receiver(ALERTMANAGER.read_text(), "ops-email"))
    assert enabled.read_text() != ALERTMANAGER.read_text()
    check = run(find_binary("amtool"), "check-config", str(enabled))
    assert check.returncode == 0, check.stdout + check.stderr
    for labels in (alert, "alertname=GPUAlertBotWebhooksRefused"):
        routed = run(find_binary("amtool"), "config", "routes", "test", f"--config.file={enabled}", labels)
        assert routed.stdout.strip() == "gpu-alert-bot,ops-email", routed.stdout + routed.stderr
    other = run(
        find_binary("amtool"), "config", "routes", "test", f"--config.file={enabled}", "alertname=GPUTempCritical"
    )
    assert other.stdout.strip() == "gpu-alert-bot"


@pytest.mark.realstack
async def test_the_example_alertmanager_delivers_to_the_bot_with_its_token(tmp_path: Path) -> None:
    """The shipped file as it is, with only the bot's address and the token file's path changed."""
    token = tmp_path / "webhook_token"
    token.write_text("a-token-only-alertmanager-and-the-bot-know\n")
    async with running_bot(tmp_path, {"server": {"auth": {"bearer_token_file": str(token)}}}) as bot:
        config = load(ALERTMANAGER)
        webhook = config["receivers"][0]["webhook_configs"][0]
        webhook["url"] = bot.webhook_url
        webhook["http_config"]["authorization"]["credentials_file"] = str(token)
        config["route"]["group_wait"] = "0s"
        am = Alertmanager(tmp_path / "am", config)
        try:
            am.amtool("alert", "add", "Watchdog", "severity=none", f"--start={datetime.now(UTC).isoformat()}")
            events = await eventually(lambda: bot.console_events(), timeout=20)
            assert events[0]["alertname"] == "Watchdog"
            assert bot.metric("gpu_alert_bot_notifications_received_total") >= 1
        finally:
            am.stop()


@pytest.mark.realstack
def test_a_critical_alert_mutes_only_the_warning_about_the_same_filesystem_or_sensor(tmp_path: Path) -> None:
    """The shipped inhibit rules in a real Alertmanager: the critical PrometheusDiskFilling on / mutes the warning
    on /, not the one on /data; the critical inlet alert mutes only its own sensor's warning, the critical GPU memory
    temperature only its own GPU's."""
    config = load(ALERTMANAGER)
    config["receivers"][0]["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"] = str(
        tmp_path / "unused_token"
    )
    am = Alertmanager(tmp_path / "am", config)
    start = f"--start={datetime.now(UTC).isoformat()}"
    disk = ["alertname=PrometheusDiskFilling", "instance=node-exporter:9100"]
    inlet = ["alertname=InletTemperatureHigh", "instance=k-ai-01.lan:9290"]
    memory = ["alertname=GPUMemoryTempHigh", "instance=k-ai-01.lan:9400"]
    try:
        for labels in (
            [*disk, "mountpoint=/", "severity=critical"],
            [*disk, "mountpoint=/", "severity=warning"],
            [*disk, "mountpoint=/data", "severity=warning"],
            [*inlet, "name=Inlet Temp", "severity=critical"],
            [*inlet, "name=Inlet Temp", "severity=warning"],
            [*inlet, "name=Ambient Temp", "severity=warning"],
            [*memory, "gpu=0", "severity=critical"],
            [*memory, "gpu=0", "severity=warning"],
            [*memory, "gpu=1", "severity=warning"],
        ):
            am.amtool("alert", "add", *labels, start)
        alerts = httpx.get(f"{am.url}/api/v2/alerts", timeout=5).json()
    finally:
        am.stop()
    muted = {
        (
            a["labels"].get("mountpoint") or a["labels"].get("name") or "GPU " + a["labels"]["gpu"],
            a["labels"]["severity"],
        )
        for a in alerts
        if a["status"]["inhibitedBy"]
    }
    assert muted == {("/", "warning"), ("Inlet Temp", "warning"), ("GPU 0", "warning")}


# --- Prometheus -------------------------------------------------------------------------------------
def test_promtool_accepts_the_prometheus_config_with_the_shipped_rules(tmp_path: Path) -> None:
    config = load(PROMETHEUS)
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    config["rule_files"] = [str(CONFIG / "rules" / "*.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = run(find_binary("promtool"), "check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 rule files found" in result.stdout


def test_prometheus_keeps_the_seeds_scrape_config_and_labels_every_gpu_server_series_with_its_host() -> None:
    config = load(PROMETHEUS)
    assert config["global"] == {"scrape_interval": "15s", "evaluation_interval": "15s"}
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for name, targets in SEED_JOBS.items():
        assert jobs[name]["static_configs"][0]["targets"] == targets
    for name in [*SEED_JOBS, "cadvisor"]:
        [relabel] = jobs[name]["relabel_configs"]
        assert relabel["target_label"] == "host"
        prometheus_anchored = re.compile(f"^(?:{relabel['regex']})$")
        match = prometheus_anchored.match("k-ai-01.lan:9400")
        assert match is not None and match.group(1) == "k-ai-01.lan"
    assert "mgmt-node" in jobs  # PrometheusDiskFilling watches the monitoring VM's own disk


# --- docker compose ---------------------------------------------------------------------------------
def test_compose_adds_the_bot_to_the_seeds_management_stack() -> None:
    services = load(COMPOSE)["services"]
    assert {"prometheus", "grafana", "alertmanager", "loki", "gpu-alert-bot"} <= set(services)
    prometheus = services["prometheus"]
    assert "--storage.tsdb.retention.time=30d" in prometheus["command"]
    assert "--storage.tsdb.retention.size=20GB" in prometheus["command"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "./rules:/etc/prometheus/rules:ro" in prometheus["volumes"]
    assert "./alertmanager.example.yml:/etc/alertmanager/alertmanager.yml:ro" in services["alertmanager"]["volumes"]
    assert "webhook_token" in services["alertmanager"]["secrets"]


def test_services_without_authentication_are_published_on_loopback_only() -> None:
    """Alertmanager would forward whatever it is sent with the bot's token; Prometheus has its lifecycle API."""
    services = load(COMPOSE)["services"]
    for name in ("prometheus", "alertmanager", "loki"):
        for port in services[name]["ports"]:
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"


def test_compose_passes_secrets_as_files_never_as_environment_values() -> None:
    compose = load(COMPOSE)
    for name, service in compose["services"].items():
        for entry in service.get("environment", []):
            key, _, value = entry.partition("=")
            if SECRET_WORDS.search(key):
                assert key.endswith("__FILE") and value.startswith("/run/secrets/"), f"{name}: {entry}"
    for secret in compose["secrets"].values():
        assert set(secret) == {"file"} and secret["file"].startswith("./secrets/")
    readme = (CONFIG / "secrets" / "README.md").read_text()
    for secret in compose["secrets"].values():
        assert Path(secret["file"]).name in readme
    ignored = (CONFIG / "secrets" / ".gitignore").read_text().split()
    assert ignored == ["*", "!.gitignore", "!README.md"]  # a secret file created there is never committed


def test_the_bot_service_mounts_its_config_read_only_keeps_its_store_in_a_volume_and_has_a_healthcheck() -> None:
    compose = load(COMPOSE)
    bot = compose["services"]["gpu-alert-bot"]
    assert "environment" not in bot
    assert bot["secrets"] == ["webhook_token"]
    volumes = {v.split(":")[1]: v for v in bot["volumes"]}
    config_target = bot["command"][bot["command"].index("--config") + 1]
    assert volumes[config_target] == f"./bot.compose.yaml:{config_target}:ro"
    store_dir = str(Path(load(BOT_IN_COMPOSE)["store"]["path"]).parent)
    volume_name = volumes[store_dir].split(":")[0]
    assert volume_name in compose["volumes"]
    playbooks_dir = load(BOT_IN_COMPOSE)["playbooks"]["dir"]
    assert volumes[playbooks_dir] == f"../playbooks:{playbooks_dir}:ro"
    assert bot["healthcheck"]["test"][1:4] == ["gpu-alert-bot", "healthcheck", "--config"]
    assert bot["healthcheck"]["test"][4] == config_target and "--ready" in bot["healthcheck"]["test"]
    for source in ("./prometheus.yml", "./rules", "./alertmanager.example.yml", "./bot.compose.yaml", "../playbooks"):
        assert (CONFIG / source).exists(), source


def test_the_bots_compose_config_is_valid_and_listens_beyond_loopback_only_with_a_token(tmp_path: Path) -> None:
    token = tmp_path / "webhook_token"
    token.write_text("t0k3n\n")
    text = BOT_IN_COMPOSE.read_text()
    text = text.replace("/run/secrets/webhook_token", str(token))
    text = text.replace("/var/lib/gpu-alert-bot", str(tmp_path))
    text = text.replace("/etc/gpu-alert-bot/playbooks", str(REPO / "playbooks"))
    path = tmp_path / "bot.yaml"
    path.write_text(text)
    config = load_config(path)
    assert config.server.auth.enabled
    assert ipaddress.ip_address(listen_host(config)).is_unspecified
    assert config.enrichment.prometheus is not None and config.enrichment.loki is not None
    PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)


# --- the GPU server's compose file --------------------------------------------------------------------
def test_the_gpu_node_compose_runs_every_gpu_server_target_prometheus_scrapes() -> None:
    services = load(GPU_NODE_COMPOSE)["services"]
    seed_services = {"dcgm-exporter", "node-exporter", "ipmi-exporter", "smartctl-exporter", "promtail"}
    assert seed_services | {"cadvisor"} <= set(services)
    published = {int(port.split(":")[0]) for service in services.values() for port in service.get("ports", [])}
    jobs = {job["job_name"]: job for job in load(PROMETHEUS)["scrape_configs"]}
    for name in ("dcgm", "node", "ipmi", "smart", "cadvisor"):
        for target in jobs[name]["static_configs"][0]["targets"]:
            assert int(target.rsplit(":", 1)[1]) in published, (name, target)


def test_dcgm_exporter_is_named_after_the_machine_and_cadvisor_keeps_the_restart_count() -> None:
    services = load(GPU_NODE_COMPOSE)["services"]
    dcgm = services["dcgm-exporter"]
    assert dcgm["container_name"] == "dcgm-exporter"
    # Hostname label: NODE_NAME, else the container's hostname (a random ID unless set).
    assert dcgm["hostname"].startswith("${NODE_NAME")
    assert any(entry.startswith("NODE_NAME=${NODE_NAME") for entry in dcgm["environment"])
    command = services["cadvisor"]["command"]
    assert "--store_container_labels=false" in command
    [whitelist] = [arg for arg in command if arg.startswith("--whitelisted_container_labels=")]
    assert "restartcount" in whitelist.partition("=")[2].split(",")  # ContainerRestartLoop counts on it


def test_promtail_on_the_gpu_node_labels_the_journal_as_the_bot_queries_it() -> None:
    promtail = load(GPU_NODE_COMPOSE)["services"]["promtail"]
    assert f"./{PROMTAIL.name}:/etc/promtail/promtail.yml:ro" in promtail["volumes"]
    assert "-config.expand-env=true" in promtail["command"]
    [scrape] = load(PROMTAIL)["scrape_configs"]
    assert scrape["journal"]["labels"] == {"job": "syslog", "host": "${NODE_NAME}"}
    assert load(BOT_IN_COMPOSE)["enrichment"]["loki"]["selector"] == '{job="syslog", host="{host}"}'


def test_docker_compose_steps_in_playbooks_name_services_of_the_shipped_compose_files() -> None:
    """`docker compose restart dcgm-exporter` works from the GPU server's compose directory only if that file
    has a service of that name (the seed's compose sets no container_name, so plain `docker restart` would not)."""
    services = set(load(COMPOSE)["services"]) | set(load(GPU_NODE_COMPOSE)["services"])
    # The service is the first word after the verb and its options (`logs --tail 50 dcgm-exporter`).
    service_step = re.compile(
        r"docker compose (?:ps|logs|restart|start|stop|exec)(?: +-[-\w]+(?: +\d\w*)?)* +([a-z][\w-]*)"
    )
    named = set()
    for path in sorted((REPO / "playbooks").glob("*.yaml")):
        for step in (yaml.safe_load(path.read_text()) or {}).get("steps", []):
            named |= set(service_step.findall(f"{step['text']}\n{step.get('command', '')}"))
    assert "dcgm-exporter" in named
    assert named <= services, named - services


@pytest.mark.parametrize("compose", [COMPOSE, GPU_NODE_COMPOSE], ids=lambda path: path.name)
def test_every_file_a_compose_service_mounts_from_the_repository_is_shipped(compose: Path) -> None:
    # A missing source is not an error for Docker: it creates an empty root-owned directory instead.
    for name, service in load(compose)["services"].items():
        for volume in service.get("volumes") or []:
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if source.startswith("."):
                assert (compose.parent / source).exists(), f"{compose.name}: {name} mounts missing {source}"


def test_the_self_test_alert_has_a_route_that_resolves_within_seconds() -> None:
    assert '{alertname="GPUSelfTest"}  receiver: gpu-alert-bot' in routes_for("alertname=GPUSelfTest", "selftest=abc")
    [selftest] = [r for r in load(ALERTMANAGER)["route"]["routes"] if r["matchers"] == ['alertname="GPUSelfTest"']]
    assert (selftest["group_wait"], selftest["group_interval"]) == ("0s", "10s")

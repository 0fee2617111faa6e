"""Alertmanager in kube-prometheus sends every alert to the bot with the bearer token from a Secret: the plain
configuration (deploy/kubernetes/alertmanager/alertmanager.yaml) passes `amtool check-config` and routes as
config/alertmanager.example.yml does, and the AlertmanagerConfig object says the same in the operator's words."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from bot.ingest import WEBHOOK_PATH
from tests.support.manifests import KUBERNETES, only, rendered
from tests.support.processes import find_binary

SNIPPET = KUBERNETES / "alertmanager" / "alertmanager.yaml"
# Where the Prometheus operator mounts a Secret listed in the Alertmanager object's spec.secrets.
OPERATOR_SECRETS = "/etc/alertmanager/secrets"


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_binary("amtool"), *args], capture_output=True, text=True, timeout=60, check=False)


def test_amtool_accepts_the_configuration() -> None:
    result = amtool("check-config", str(SNIPPET))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_goes_to_the_bot_and_the_watchdog_on_its_own_route() -> None:
    def route(*labels: str) -> str:
        result = amtool("config", "routes", "test", f"--config.file={SNIPPET}", "--tree", *labels)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    assert '{alertname="Watchdog"}  receiver: gpu-alert-bot' in route("alertname=Watchdog")
    assert "default-route  receiver: gpu-alert-bot" in route("alertname=GPUXIDError", "namespace=gpu-operator")
    config = yaml.safe_load(SNIPPET.read_text())
    assert {r["receiver"] for r in config["route"]["routes"]} == {config["route"]["receiver"]} == {"gpu-alert-bot"}


def test_the_webhook_reaches_the_bots_service_with_the_token_of_a_secret(tmp_path: Path) -> None:
    manifests = rendered(tmp_path, "single", ("kube-prometheus",))
    service = only(manifests, "Service")
    http = next(port["port"] for port in service["spec"]["ports"] if port["name"] == "http")
    url = f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{http}{WEBHOOK_PATH}"
    [receiver] = yaml.safe_load(SNIPPET.read_text())["receivers"]
    [webhook] = receiver["webhook_configs"]
    assert webhook["url"] == url and webhook["send_resolved"] is True
    authorization = webhook["http_config"]["authorization"]
    assert authorization["type"] == "Bearer"
    match = re.fullmatch(rf"{OPERATOR_SECRETS}/([^/]+)/([^/]+)", authorization["credentials_file"])
    assert match is not None
    [operator_receiver] = only(manifests, "AlertmanagerConfig")["spec"]["receivers"]
    credentials = operator_receiver["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"]
    assert (credentials["name"], credentials["key"]) == match.groups()


def _route(route: dict[str, Any]) -> dict[str, Any]:
    """An AlertmanagerConfig route in Alertmanager's own words (the fields these files use)."""
    names = {"groupBy": "group_by", "groupWait": "group_wait", "groupInterval": "group_interval"}
    names |= {"repeatInterval": "repeat_interval", "receiver": "receiver", "continue": "continue"}
    translated: dict[str, Any] = {names[key]: value for key, value in route.items() if key in names}
    unknown = set(route) - set(names) - {"matchers", "routes"}
    assert not unknown, f"this translation does not know {unknown}"
    if "matchers" in route:
        translated["matchers"] = [f'{m["name"]}{m["matchType"]}"{m["value"]}"' for m in route["matchers"]]
    if "routes" in route:
        translated["routes"] = [_route(child) for child in route["routes"]]
    return translated


def _webhook(config: dict[str, Any]) -> dict[str, Any]:
    return {"url": config["url"], "send_resolved": config["sendResolved"], "max_alerts": config["maxAlerts"]}


def test_the_alertmanagerconfig_routes_and_sends_as_the_configuration_does(tmp_path: Path) -> None:
    operator = only(rendered(tmp_path, "ha", ("kube-prometheus",)), "AlertmanagerConfig")
    snippet = yaml.safe_load(SNIPPET.read_text())
    assert _route(operator["spec"]["route"]) == snippet["route"]
    [operator_receiver] = operator["spec"]["receivers"]
    [receiver] = snippet["receivers"]
    assert operator_receiver["name"] == receiver["name"]
    without_auth = [{k: v for k, v in w.items() if k != "http_config"} for w in receiver["webhook_configs"]]
    assert [_webhook(w) for w in operator_receiver["webhookConfigs"]] == without_auth
    # As the operator writes it (the token file aside), Alertmanager accepts it.
    translated = {"route": _route(operator["spec"]["route"]), "receivers": snippet["receivers"]}
    (tmp_path / "translated.yml").write_text(yaml.safe_dump(translated))
    assert amtool("check-config", str(tmp_path / "translated.yml")).returncode == 0

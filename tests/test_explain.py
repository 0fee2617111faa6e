"""`gpu-alert-bot explain`: routing, playbook and the rendered message per receiver, for a real Alertmanager capture
(tests/fixtures/payloads/ holds webhook bodies copied from the reference captures), without sending or storing."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import yaml
from pydantic import BaseModel

from bot.commands.cli import main
from bot.commands.explain import explain as explain_report
from bot.commands.explain import format_text
from bot.config import BotConfig, load_config
from bot.enrich.gpu import GpuIdentity
from bot.models import Delivery, GpuEvent, WebhookPayload
from bot.playbooks import PlaybookSet
from bot.sinks import SINK_TYPES, DeliveryResult, Preview, SinkResources, SinkType
from bot.store import open_store
from tests.support.bot import eventually, running_bot
from tests.support.payloads import FIXTURE_CAPTURES, am_alert, webhook
from tests.support.processes import free_port

PAYLOADS = Path(__file__).resolve().parent / "fixtures" / "payloads"
FIRING = PAYLOADS / "am025_webhook_firing_truncated.json"
RESOLVED = PAYLOADS / "am025_webhook_resolved.json"
E2E_FIRING = PAYLOADS / "prom242_am025_e2e_firing.json"
ROUTING_KEY = "0123456789abcdef0123456789abcdef"
SLACK_TOKEN = "xoxb-not-a-real-token"


def write_config(tmp_path: Path, **extra: Any) -> Path:
    (tmp_path / "pd_key").write_text(ROUTING_KEY + "\n")
    (tmp_path / "slack_token").write_text(SLACK_TOKEN + "\n")
    # Playbooks of the test's own, so the test does not follow edits of the bundled ones.
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir(exist_ok=True)
    (playbooks / "xid.yaml").write_text("match: {alertname: GpuXidError}\ntitle: Xid error on {host}\n")
    config: dict[str, Any] = {
        "store": {"path": str(tmp_path / "store" / "bot.db")},
        "playbooks": {"dir": "playbooks"},
        "receivers": [
            {"type": "console", "name": "console"},
            {"type": "slack", "name": "slack-gpu", "channel": "#gpu-alerts", "token_file": "slack_token"},
            {
                "type": "email",
                "name": "oncall-email",
                "to": ["oncall@example.com"],
                "from": "gpu-alert-bot@example.com",
                "smarthost": "smtp.example.com:587",
            },
            {"type": "pagerduty", "name": "pd", "routing_key_file": "pd_key"},
        ],
        "routing": {
            "rules": [
                {"matchers": ['severity="critical"', 'gpu="0"'], "receivers": ["pd", "oncall-email"], "continue": True},
                {"matchers": ['alertname=~"vLLM.*"'], "receivers": ["console"]},
                {"matchers": ['alertname=~"Gpu.*"', 'host=~"gpu\\d+"'], "receivers": ["slack-gpu"]},
                {"matchers": [], "receivers": ["console"]},
            ],
            "default": ["console"],
        },
    }
    config.update(extra)
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["explain", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_human_output_shows_rules_receivers_playbook_and_every_rendering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = explain(capsys, str(FIRING), "--config", str(write_config(tmp_path)))
    assert code == 0
    assert "Alertmanager left out 1 more alert(s)" in out
    first, second = out.split("=== Alert 2 of 2")
    assert "=== Alert 1 of 2: GpuXidError (firing) ===" in first
    assert 'rule 1 {severity="critical", gpu="0"}: matched, continue -> pd, oncall-email' in first
    assert 'rule 2 {alertname=~"vLLM.*"}: no, alertname=~"vLLM.*" fails (alertname is "GpuXidError")' in first
    assert 'rule 3 {alertname=~"Gpu.*", host=~"gpu\\\\d+"}: matched -> slack-gpu' in first
    assert "rule 4: not evaluated" in first
    assert "receivers -> pd, oncall-email, slack-gpu" in first
    assert "Playbook:   xid\n" in first and "Enrichment: skipped" in first
    # Every receiver's message, rendered by the sinks' own renderers, as a person reads it (JSON: --format json).
    assert (
        "--- pd (pagerduty) ---\nPOST https://events.pagerduty.com/v2/enqueue\ntrigger · dedup_key ea7d2357f640d0c0@"
        in first
    )
    assert "Summary:  GpuXidError on gpu01 GPU 0: Xid 79 on gpu01\n" in first and "  facts:\n    Host: gpu01" in first
    assert "Subject: [FIRING] GpuXidError on gpu01 GPU 0" in first
    assert "FIRING (critical): GpuXidError on gpu01 GPU 0" in first
    assert "--- slack-gpu (slack) ---\nchannel #gpu-alerts\n🔴 GpuXidError on gpu01 GPU 0\nXid 79 on gpu01\n" in first
    assert "*Host*: gpu01\n" in first and "🔗 Runbook (https://runbooks/xid)" in first
    assert '"blocks"' not in out and '"event_action"' not in out
    assert "Incidents:  none: each alert is told on its own" in out
    # The second alert (gpu 1) fails rule 1 on its gpu label and goes to Slack only.
    assert 'rule 1 {severity="critical", gpu="0"}: no, gpu="0" fails (gpu is "1")' in second
    assert "receivers -> slack-gpu" in second
    assert ROUTING_KEY not in out and SLACK_TOKEN not in out
    assert "<routing key from " in out


def test_json_output_for_machines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(capsys, str(FIRING), "--config", str(write_config(tmp_path)), "--format", "json")
    assert code == 0
    report = json.loads(out)
    assert report["payload"] == {
        "receiver": "web.hook",
        "group_key": '{}:{alertname="GpuXidError", host="gpu01"}',
        "status": "firing",
        "alerts": 2,
        "truncated_alerts": 1,
    }
    first = report["alerts"][0]
    assert first["route"]["receivers"] == ["pd", "oncall-email", "slack-gpu"]
    assert first["route"]["default"] is False
    assert [r["matched"] for r in first["route"]["rules"]] == [True, False, True]
    assert first["route"]["rules"][1]["failed_matcher"] == 'alertname=~"vLLM.*"'
    assert first["route"]["not_evaluated"] == [4]
    by_receiver = {m["receiver"]: m for m in first["messages"]}
    event = by_receiver["pd"]["event"]
    assert event["dedup_key"] == first["alert_key"] and event["routing_key"].startswith("<routing key from ")
    assert event["payload"]["source"] == "gpu01" and event["payload"]["component"] == "GPU 0"
    email = by_receiver["oncall-email"]["email"]
    assert email["headers"]["Subject"] == "[FIRING] GpuXidError on gpu01 GPU 0"
    assert "Xid 79 on gpu01" in email["text"] and "Xid 79 on gpu01" in email["html"]
    assert by_receiver["slack-gpu"]["payload"]["attachments"][0]["blocks"]
    assert first["playbook"] == "xid"
    assert first["enrichment"] == {"ran": False, "sections": []}
    assert ROUTING_KEY not in out and SLACK_TOKEN not in out


def test_resolved_payload_renders_the_follow_ups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = explain(capsys, str(RESOLVED), "--config", str(write_config(tmp_path)), "--format", "json")
    assert code == 0
    first = json.loads(out)["alerts"][0]
    by_receiver = {m["receiver"]: m for m in first["messages"]}
    assert by_receiver["pd"]["event"]["event_action"] == "resolve"
    headers = by_receiver["oncall-email"]["email"]["headers"]
    assert headers["Subject"] == "Re: [RESOLVED] GpuXidError on gpu01 GPU 0 after 1 min"
    assert headers["In-Reply-To"].endswith(".firing@example.com>")


def test_default_receivers_and_console_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["routing"]["rules"] = [{"matchers": ['team="storage"'], "receivers": ["pd"]}]
    config.write_text(yaml.safe_dump(data))
    code, out, _ = explain(capsys, str(E2E_FIRING), "--config", str(config))
    assert code == 0
    assert 'rule 1 {team="storage"}: no, team="storage" fails (team not set)' in out
    assert "no rule matched: default receivers -> console" in out
    console_line = out.split("--- console (console) ---\n", 1)[1].splitlines()[0]
    line = json.loads(console_line)
    assert (line["alertname"], line["host"], line["event"]) == ("GpuXidError", "127.0.0.1", "firing")


def test_nothing_is_sent_or_stored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    code, _, _ = explain(capsys, str(FIRING), "--config", str(config))
    assert code == 0
    assert not (tmp_path / "store").exists()


def test_enrich_runs_the_configured_enrichers_within_the_budget_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    config = write_config(tmp_path, enrichment={"budget": "2s", "prometheus": {"url": unreachable, "timeout": "1s"}})
    code, out, _ = explain(capsys, str(FIRING), "--config", str(config), "--enrich", "--format", "json")
    assert code == 0
    enrichment = json.loads(out)["alerts"][0]["enrichment"]
    assert enrichment["ran"] is True
    sections = {s["name"]: s["status"] for s in enrichment["sections"]}
    assert sections["prometheus"] == "unavailable"
    assert set(sections) == {"gpu", "workload", "xid", "recurrence", "prometheus", "related"}
    assert not (tmp_path / "store").exists()


def test_reads_the_payload_from_stdin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Stdin:
        buffer = __import__("io").BytesIO(E2E_FIRING.read_bytes())

    monkeypatch.setattr(sys, "stdin", Stdin)
    code, out, _ = explain(capsys, "-", "--config", str(write_config(tmp_path)))
    assert code == 0 and "GpuXidError" in out


def test_a_saved_request_is_explained_from_its_body(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capture = FIXTURE_CAPTURES / "am025_webhook_resolved.json"
    code, out, err = explain(capsys, str(capture), "--config", str(write_config(tmp_path)), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["payload"]["group_key"] == json.loads(capture.read_text())["body"]["groupKey"]


def test_a_file_that_is_not_a_webhook_body_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"alerts": "nope"}))
    code, out, err = explain(capsys, str(bad), "--config", str(write_config(tmp_path)))
    assert code == 2 and out == ""
    assert "not an Alertmanager webhook body" in err
    code, _, err = explain(capsys, str(tmp_path / "missing.json"), "--config", str(write_config(tmp_path)))
    assert code == 2 and "cannot read" in err


class HookReceiver(BaseModel):
    """A receiver type the bot does not ship: a JSON webhook."""

    type: Literal["hook"] = "hook"
    name: str
    url: str


class HookSink:
    def __init__(self, receiver: HookReceiver) -> None:
        self.name = receiver.name
        self._url = receiver.url

    async def deliver(self, delivery: Delivery) -> DeliveryResult:
        raise AssertionError("explain sends nothing")

    def preview(self, delivery: Delivery) -> Preview:
        return {"url": self._url, "body": {"title": delivery.message.title, "status": delivery.message.status}}

    async def close(self) -> None:
        return None


def build_hook(receiver: HookReceiver, _shared: SinkResources) -> HookSink:
    return HookSink(receiver)


async def test_a_sink_type_explain_does_not_know_is_previewed_by_its_own_preview(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(SINK_TYPES, HookReceiver, SinkType[HookReceiver](build=build_hook, preview=HookSink))
    config = load_config(write_config(tmp_path))
    hook = HookReceiver(name="hook", url="https://hooks.example.com/gpu")
    config = config.model_copy(
        update={
            "receivers": [*config.receivers, hook],
            "routing": config.routing.model_copy(update={"rules": [], "default": ["hook"]}),
        }
    )
    playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)
    payload = WebhookPayload.model_validate_json(E2E_FIRING.read_bytes())

    report = await explain_report(payload, config, playbooks)

    assert report["alerts"][0]["messages"] == [
        {
            "receiver": "hook",
            "type": "hook",
            "url": "https://hooks.example.com/gpu",
            "body": {"title": "GpuXidError on 127.0.0.1", "status": "firing"},
        }
    ]
    # For people, a preview without a text form of its own is shown as JSON.
    shown = format_text(report).split("--- hook (hook) ---\n", 1)[1]
    assert json.loads(shown)["body"]["title"] == "GpuXidError on 127.0.0.1"


async def test_explain_shows_the_message_the_pipeline_delivers(tmp_path: Path) -> None:
    """One decision for both: the console line explain previews is the one the running bot prints."""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "xid.yaml").write_text("match: {alertname: GpuXidError}\ntitle: Xid error on {host}\n")
    config = {"playbooks": {"dir": str(playbooks)}, "receivers": [{"type": "console", "name": "console"}]}
    raw = E2E_FIRING.read_bytes()
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
        response = await client.post(bot.webhook_url, content=raw, headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        [printed] = await eventually(bot.console_events)
        loaded = PlaybookSet.load(bot.config.playbooks.dir, bot.config.playbooks.vars)
        report = await explain_report(WebhookPayload.model_validate_json(raw), bot.config, loaded, enrich=True)
    [previewed] = report["alerts"][0]["messages"]
    ids = ("event_id", "delivery_id")
    assert {k: v for k, v in previewed["line"].items() if k not in ids} == {
        k: v for k, v in printed.items() if k not in ids
    }


def test_enrich_beside_an_existing_store_reads_the_gpu_history_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The running bot owns the store: explain opens it read-only, and the GPU history is read, not recorded."""
    config = write_config(tmp_path)
    gpu = GpuIdentity(host="gpu01", index="0")
    earlier = GpuEvent(
        gpu_key=gpu.gpu_key, host="gpu01", kind="alert", code="GpuXidError", at=datetime.now(UTC), alert_key="old"
    )

    async def prepare() -> None:
        store = await open_store(load_config(config).store)
        await store.record_gpu_events([earlier])
        await store.close()

    asyncio.run(prepare())
    before = (tmp_path / "store" / "bot.db").read_bytes()
    code, out, err = explain(capsys, str(FIRING), "--config", str(config), "--enrich", "--format", "json")
    assert code == 0
    assert "Traceback" not in err and "readonly" not in err
    first = json.loads(out)["alerts"][0]["enrichment"]["sections"]
    [recurrence] = [s for s in first if s["name"] == "recurrence"]
    assert recurrence["status"] == "ok"
    assert recurrence["summary"] == "This GPU in the last 30 days: GpuXidError 2 times"
    assert (tmp_path / "store" / "bot.db").read_bytes() == before


async def test_a_stored_alert_is_explained_by_its_short_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Beside the running bot: the alert it stored is found by the short id of its message, and explained as the
    message the bot delivered."""
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "xid.yaml").write_text("match: {alertname: GpuXidError}\ntitle: Xid error on {host}\n")
    config = {"playbooks": {"dir": str(playbooks)}, "receivers": [{"type": "console", "name": "console"}]}
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
        headers = {"Content-Type": "application/json"}
        response = await client.post(bot.webhook_url, content=E2E_FIRING.read_bytes(), headers=headers)
        assert response.status_code == 200
        [printed] = await eventually(bot.console_events)
        args = ["explain", "--alert", printed["id"].upper(), "--config", str(tmp_path / "bot.yaml"), "--enrich"]
        code = await asyncio.to_thread(main, [*args, "--format", "json"])
    assert code == 0
    [alert] = json.loads(capsys.readouterr().out)["alerts"]
    assert alert["alert_key"] == printed["alert_key"]
    [previewed] = alert["messages"]
    ids = ("event_id", "delivery_id")
    assert {k: v for k, v in previewed["line"].items() if k not in ids} == {
        k: v for k, v in printed.items() if k not in ids
    }


def test_an_alert_the_store_does_not_hold_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    code, _, err = explain(capsys, "--alert", "zzzzzzz", "--config", str(config))
    assert code == 2
    assert f"cannot open the store {tmp_path / 'store' / 'bot.db'}" in err
    (tmp_path / "store").mkdir()
    asyncio.run(_empty_store(load_config(config)))
    code, _, err = explain(capsys, "--alert", "zzzzzzz", "--config", str(config))
    assert code == 2
    assert err.startswith("no alert 'zzzzzzz' in the store ")
    assert "short id its message shows" in err


async def _empty_store(config: BotConfig) -> None:
    store = await open_store(config.store)
    await store.close()


def test_a_payload_or_a_stored_alert_not_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["explain", str(FIRING), "--alert", "wvzwpbz"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["explain"])
    assert "one of the arguments payload --alert is required" in capsys.readouterr().err


def test_enrich_with_a_store_that_cannot_be_read_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A PostgreSQL store that does not answer is no empty history: explain says it cannot read it and stops."""
    (tmp_path / "dsn").write_text(f"host=127.0.0.1 port={free_port()} user=bot dbname=bot\n")
    store = {"backend": "postgresql", "dsn_file": str(tmp_path / "dsn"), "connect_timeout": 1}
    config = write_config(tmp_path, store=store)
    code, out, err = explain(capsys, str(FIRING), "--config", str(config), "--enrich")
    assert (code, out) == (1, "")
    assert "cannot read the bot's store, which --enrich reads the GPU history from: cannot connect to PostgreSQL" in err
    assert "Traceback" not in err


def xid_storm(hosts: int, gpus: int) -> dict[str, Any]:
    alerts = [
        am_alert("GpuXidError", host=f"gpu{h:02d}", gpu=str(g), annotations={"summary": f"Xid 79 on gpu{h:02d}"})
        for h in range(hosts)
        for g in range(gpus)
    ]
    return webhook(alerts, group_key='{}:{alertname="GpuXidError"}')


def test_a_storm_in_one_payload_is_explained_as_the_one_incident_each_receiver_would_get(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """20 alerts of one name, past incidents.threshold (5): one incident, previewed for every receiver its alerts go
    to; no alert gets a message of its own."""
    payload = tmp_path / "storm.json"
    payload.write_text(json.dumps(xid_storm(5, 4)))
    config = str(write_config(tmp_path))
    code, out, _ = explain(capsys, str(payload), "--config", config)
    assert code == 0
    assert "Incidents:  20 alert(s) told as one incident, GpuXidError on 5 hosts (below)" in out
    alerts, incident = out.split("\n=== Incident ")
    assert alerts.count(", no message of its own\n") == 20 and "\n--- " not in alerts
    incident_id = incident.split(":", 1)[0]
    assert incident.startswith(f"{incident_id}: GpuXidError on 5 hosts ===\nWould open: 20 new alert(s)")
    # What each receiver would get of it, as a person reads it.
    assert f"Incident `{incident_id}` · `gpu-alert-bot report {incident_id}`" in incident  # the Slack card
    assert (
        "--- slack-gpu (slack) ---\nchannel #gpu-alerts\n🔴 GpuXidError on 5 hosts\n*Scope:* 5 hosts, 20 GPUs"
        in incident
    )
    assert "Subject: [INCIDENT] GpuXidError on 5 hosts\n" in incident
    assert f"INCIDENT (critical): GpuXidError on 5 hosts\n\nIncident {incident_id} · " in incident
    assert f"Summary:  GpuXidError on 5 hosts (incident {incident_id}): 20 alerts on 5 hosts, 20 GPUs" in incident
    assert "  - gpu04 · GPUs 0-3 · 4 firing\n" in incident
    # For machines, the same.
    code, out, _ = explain(capsys, str(payload), "--config", config, "--format", "json")
    report = json.loads(out)
    [told] = report["incidents"]
    assert (told["alerts"], told["stored"], told["receivers"]) == (20, False, ["oncall-email", "pd", "slack-gpu"])
    assert all(a["messages"] == [] and a["incident"]["id"] == told["id"] for a in report["alerts"])
    assert told["messages"][2]["payload"]["attachments"][0]["blocks"][0]["type"] == "header"


def test_as_many_alerts_as_the_threshold_are_told_one_by_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = tmp_path / "few.json"
    payload.write_text(json.dumps(xid_storm(1, 5)))
    code, out, _ = explain(capsys, str(payload), "--config", str(write_config(tmp_path)), "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["incidents"] == []
    assert all(a["messages"] and "incident" not in a for a in report["alerts"])


async def test_a_stored_alert_told_as_a_line_of_an_incident_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "xid.yaml").write_text("match: {alertname: GpuXidError}\ntitle: Xid error on {host}\n")
    config = {"playbooks": {"dir": str(playbooks)}, "receivers": [{"type": "console", "name": "console"}]}
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(timeout=10) as client:
        assert (await client.post(bot.webhook_url, json=xid_storm(3, 4))).status_code == 200
        [line] = await eventually(lambda: [e for e in bot.console_events() if e["event"] == "incident"])
        member = line["sections"]["Hosts, worst first"][0].rsplit(" · ids ", 1)[1].split(", ")[0]
        args = ["explain", "--alert", member, "--config", str(tmp_path / "bot.yaml")]
        code = await asyncio.to_thread(main, args)
    assert code == 0
    out = capsys.readouterr().out
    assert f"Incident:   a line of incident {line['id']} (GpuXidError on 3 hosts), no message of its own" in out
    assert f"=== Incident {line['id']}: GpuXidError on 3 hosts ===\nIn the store, open: " in out
    assert f"`gpu-alert-bot report {line['id']}` writes its record" in out
    # The incident's console line, as the running bot printed it.
    shown = json.loads(out.split("--- console (console) ---\n", 1)[1].splitlines()[0])
    assert shown["id"] == line["id"] and shown["facts"] == line["facts"]

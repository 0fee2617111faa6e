"""Slack interactivity without Alertmanager: request signatures, hostile commands, roles from user groups, Socket
Mode against the Slack fake, ack and repeats, and the configuration checks."""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.parse
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import ConfigError, InteractivityConfig, load_config
from bot.dedup import plan_events
from bot.interact.access import Access
from bot.interact.silences import BadSilence, parse_silence_duration, typed_matchers
from bot.interact.verify import RequestVerifier
from bot.models import AlertState, AmAlert, EventKind, short_id
from bot.render.slack import escape
from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.clock import FakeClock
from tests.support.payloads import am_alert, gpu_alerts, webhook
from tests.support.slack_requests import (
    SIGNING_SECRET,
    click_payload,
    command_fields,
    interactive_config,
    post_command,
    signed_headers,
)
from tests.support.store import Opener, ingest, ingest_and_dedup, sqlite_store

# Slack's documented example (docs.slack.dev authentication/verifying-requests-from-slack).
DOC_TIMESTAMP = "1531420618"
DOC_BODY = (
    b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&"
    b"channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&"
    b"response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&"
    b"trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
DOC_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"


def doc_headers(**changes: str) -> dict[str, str]:
    return {"X-Slack-Request-Timestamp": DOC_TIMESTAMP, "X-Slack-Signature": DOC_SIGNATURE, **changes}


def test_slacks_documented_signature_passes_once_then_is_a_replay() -> None:
    clock = FakeClock(datetime.fromtimestamp(int(DOC_TIMESTAMP) + 60, UTC))
    verifier = RequestVerifier(SIGNING_SECRET, clock)
    assert verifier.problem(DOC_BODY, doc_headers()) is None
    assert verifier.problem(DOC_BODY, doc_headers()) == "replayed request"


def test_bad_signatures_are_refused_with_a_reason() -> None:
    clock = FakeClock(datetime.fromtimestamp(int(DOC_TIMESTAMP), UTC))
    verifier = RequestVerifier(SIGNING_SECRET, clock)
    assert verifier.problem(DOC_BODY + b"x", doc_headers()) == "bad signature"
    assert verifier.problem(DOC_BODY, doc_headers(**{"X-Slack-Request-Timestamp": "abc"})) is not None
    assert verifier.problem(DOC_BODY, doc_headers(**{"X-Slack-Request-Timestamp": "9" * 5000})) is not None
    assert verifier.problem(DOC_BODY, {"X-Slack-Signature": DOC_SIGNATURE}) is not None
    stale = RequestVerifier(SIGNING_SECRET, FakeClock(datetime.fromtimestamp(int(DOC_TIMESTAMP) + 301, UTC)))
    assert stale.problem(DOC_BODY, doc_headers()) == "stale request: its timestamp is more than 5 minutes away"


@given(st.text(max_size=40), st.text(max_size=40))
def test_any_header_values_get_an_answer_never_an_exception(timestamp: str, signature: str) -> None:
    verifier = RequestVerifier(SIGNING_SECRET, FakeClock())
    headers = {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature}
    assert verifier.problem(b"text=list", headers) is not None


@pytest.fixture
async def bot(tmp_path: Path, slack: FakeSlack) -> AsyncIterator[RunningBot]:
    async with running_bot(tmp_path, interactive_config(tmp_path, slack, ["http://127.0.0.1:9"])) as running:
        yield running


async def test_unsigned_stale_malformed_and_replayed_requests_get_401_with_json(bot: RunningBot) -> None:
    body = urllib.parse.urlencode(command_fields("help")).encode()
    good = signed_headers(body)
    old = signed_headers(body, timestamp=str(int(datetime.now(UTC).timestamp()) - 301))
    cases = {
        "wrong signature": {**good, "X-Slack-Signature": "v0=" + "0" * 64},
        "older than 5 minutes": old,
        "non-numeric timestamp": {**good, "X-Slack-Request-Timestamp": "abc"},
        "missing header": {"Content-Type": good["Content-Type"], "X-Slack-Signature": good["X-Slack-Signature"]},
    }
    async with aiohttp.ClientSession() as http:
        for case, headers in cases.items():
            for path in ("/slack/commands", "/slack/interactions"):
                async with http.post(bot.url + path, data=body, headers=headers) as response:
                    assert response.status == 401, case
                    assert (await response.json())["error"] == "bad_signature", case
        async with http.post(bot.url + "/slack/commands", data=body, headers=good) as response:
            assert response.status == 200
        async with http.post(bot.url + "/slack/commands", data=body, headers=good) as response:
            assert response.status == 401
            assert (await response.json())["message"] == "replayed request"
        for form, status in ((b"payload=not-json", 400), (b"payload=%5B1%5D", 400), (b"ssl_check=1&token=x", 200)):
            path = "/slack/commands" if b"ssl_check" in form else "/slack/interactions"
            async with http.post(bot.url + path, data=form, headers=signed_headers(form)) as response:
                assert response.status == status, form
                if status == 400:
                    assert (await response.json())["error"] == "bad_payload"


async def test_hostile_commands_get_a_clear_refusal_and_nothing_is_echoed_unescaped(bot: RunningBot) -> None:
    async with aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook(gpu_alerts(1)))
    [alert] = await eventually(lambda: bot.runtime.store.list_alerts("firing"))
    sid = short_id(alert.key)
    answers = {
        'list alertname=~"(a+)+$"': "`list` takes = and != matchers only (no regular expressions).",
        "list " + "x" * 10_000: "Command too long (over 1000 characters).",
        "ack <!channel>": "Unknown alert id `&lt;!channel&gt;`.",
        'silence alertname=~".*" 1h': "Refused: these matchers could silence every alert",
        'silence host!="" 1h': "Refused: these matchers could silence every alert",
        f"silence {sid} 30d": "The duration is over the allowed maximum (7d).",
        f"silence {sid} 1fortnight": "Bad duration: use minutes, hours or days",
        'silence host="a <!here> 2h': "Unbalanced quotes.",
        "frobnicate <@U123>": "Unknown command. Try:",
    }
    for text, expected in answers.items():
        answer = await post_command(bot.url, text)
        assert answer.startswith(expected), (text, answer)
        assert "<!" not in answer and "<@" not in answer
    assert (await bot.runtime.store.get_alert(alert.key)).silence_id is None  # type: ignore[union-attr]
    entries = await bot.runtime.store.audit_log(datetime(2026, 1, 1, tzinfo=UTC))
    assert len(entries) == len(answers) and {e.outcome for e in entries} == {"invalid"}


async def test_list_shows_firing_alerts_with_their_ids_and_help_lists_commands(bot: RunningBot) -> None:
    async with aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook(gpu_alerts(2)))
    alerts = await eventually(lambda: bot.runtime.store.list_alerts("firing"))
    await eventually(lambda: len(alerts) == 2)
    listed = await post_command(bot.url, "list gpu=1")
    [one] = [a for a in alerts if a.labels["gpu"] == "1"]
    assert listed.startswith(f"`{short_id(one.key)}` *GPUXidError k-ai-01 GPU 1*") and "\n" not in listed
    assert "`unsilence SILENCE_ID`" in await post_command(bot.url, "help")
    status = await post_command(bot.url, "status")
    assert "Store: writable" in status and "Alertmanager: NOT reachable" in status and "Watchdog: never" in status
    assert "Dead man's switch: never armed: no Watchdog received yet" in status


async def test_status_reports_the_heartbeat_the_dead_mans_switch_is_configured_to_listen_for(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"])
    config["deadman"] = {"alertname": "DeadMansSwitch"}
    async with running_bot(tmp_path, config) as bot, aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook([am_alert("DeadMansSwitch", severity="none")]))
        await eventually(lambda: bot.runtime.store.list_alerts("firing"))
        status = await post_command(bot.url, "status")
    assert "\nDeadMansSwitch: last seen " in status and "Watchdog:" not in status


@given(st.text(max_size=30))
def test_typed_silence_parsers_either_parse_or_explain(text: str) -> None:
    for parse in (lambda: parse_silence_duration(text, 86400.0), lambda: typed_matchers(text.split())):
        try:
            parse()
            explained = "parsed"
        except BadSilence as exc:
            explained = str(exc)
        assert explained


async def test_socket_mode_delivers_a_command_and_a_click_acknowledged_over_the_socket(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], socket_mode=True)
    config["interactivity"]["app_token_file"] = str(tmp_path / "app_token")
    async with running_bot(tmp_path, config) as bot, aiohttp.ClientSession() as http:
        await http.post(bot.webhook_url, json=webhook(gpu_alerts(1)))
        [root] = await eventually(slack.top_level)
        [alert] = await bot.runtime.store.list_alerts("firing")
        await eventually(lambda: slack.socket_connected)

        envelope = await slack.send_envelope("slash_commands", command_fields("list"))
        ack = await eventually(lambda: slack.socket_acks.get(envelope))
        assert ack["payload"]["text"].startswith(f"`{short_id(alert.key)}`")

        click = click_payload("ack", alert.key, root.ts, response_url=slack.response_url())
        envelope = await slack.send_envelope("interactive", click)
        assert await eventually(lambda: slack.socket_acks.get(envelope)) == {"envelope_id": envelope}
        await eventually(lambda: "acknowledged by *alice*" in root.rendered_text())
        [answer] = await eventually(lambda: slack.responses)
        assert answer["text"].startswith(f"Acknowledged `{short_id(alert.key)}`")


async def test_roles_come_from_user_groups_read_from_slack_and_kept_for_a_while(slack: FakeSlack) -> None:
    slack.usergroups = {"S0ONCALL": ["U0GROUPIE"]}
    config = InteractivityConfig.model_validate(
        {
            "receiver": "slack",
            "socket_mode": True,
            "app_token_file": __file__,
            "roles": [{"name": "viewer", "users": ["U0VIEWER01"]}, {"name": "responder", "groups": ["S0ONCALL"]}],
            "group_cache": "5m",
        }
    )
    web = AsyncWebClient(token=DEFAULT_TOKEN, base_url=slack.api_url)

    async def members(group: str) -> list[str]:
        return list((await web.usergroups_users_list(usergroup=group))["users"])

    clock = FakeClock()
    access = Access(config, members, clock)
    assert await access.allowed("U0GROUPIE", "ack", "responder")
    assert not await access.allowed("U0VIEWER01", "ack", "responder")
    assert await access.allowed("U0VIEWER01", "list", "viewer")
    slack.usergroups = {"S0ONCALL": []}
    assert await access.allowed("U0GROUPIE", "ack", "responder")  # still cached
    await clock.advance(301)
    assert not await access.allowed("U0GROUPIE", "ack", "responder")
    assert len(slack.calls_of("usergroups.users.list")) == 2


def _acked(alert: AmAlert) -> AlertState:
    now = datetime.now(UTC)
    return AlertState(
        key=alert.key,
        fingerprint=alert.fingerprint,
        status="firing",
        labels=alert.labels,
        starts_at=alert.starts_at,
        first_seen=now,
        last_seen=now,
        acked_by="alice",
        acked_at=now,
    )


def test_an_acknowledged_alert_is_not_repeated() -> None:
    alert = AmAlert.model_validate_json(json.dumps(am_alert(gpu="0")))
    assert [d.event for d in plan_events({alert.key: _acked(alert)}, [alert], now=datetime.now(UTC))] == [None]


async def test_ack_is_stored_with_its_event_once_and_firing_again_clears_it(opened: Opener) -> None:
    async with opened(dedup_window=0) as store:
        await ingest_and_dedup(store, webhook(gpu_alerts(1)))
        [alert] = await store.list_alerts()
        at = datetime(2026, 11, 30, 12, tzinfo=UTC)
        assert await store.ack(alert.key, "alice", at)
        assert not await store.ack(alert.key, "bob", at)
        acked = await store.get_alert(alert.key)
        assert acked is not None and (acked.acked_by, acked.acked_at) == ("alice", at)
        assert [e.kind for e in await store.alert_events(alert.key)] == [EventKind.FIRING, EventKind.ACK]
        assert await store.unack(alert.key, "acknowledgement withdrawn by alice")
        assert not await store.unack(alert.key, "again")
        assert (await store.get_alert(alert.key)).acked_by is None  # type: ignore[union-attr]
        assert await store.ack(alert.key, "bob", at)
        kinds = [e.kind for e in await store.alert_events(alert.key)]
        assert kinds == [EventKind.FIRING, EventKind.ACK, EventKind.NOTE, EventKind.ACK]
        resolved = gpu_alerts(1)
        resolved[0].update(status="resolved", endsAt=datetime.now(UTC).isoformat())
        await ingest_and_dedup(store, webhook(resolved))
        assert not await store.ack(alert.key, "bob", at)
        await ingest(store, webhook(gpu_alerts(1)))
        await store.dedup_pending(functools.partial(plan_events, late_copy_window=0), 10)  # firing again
        again = await store.get_alert(alert.key)
        assert again is not None and again.status == "firing" and again.acked_by is None


def _config_problems(
    tmp_path: Path, interactivity: dict[str, Any], with_alertmanager: bool = True, am_url: str = "http://127.0.0.1:9093"
) -> list[str]:
    (tmp_path / "token").write_text("xoxb-x\n")
    data: dict[str, Any] = {
        "receivers": [{"type": "slack", "name": "slack", "channel": "#a", "token_file": str(tmp_path / "token")}],
        "routing": {"default": ["slack"]},
        "interactivity": interactivity,
    }
    if with_alertmanager:
        data["alertmanager"] = {"urls": [am_url]}
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_config(path)
    except ConfigError as error:
        return error.problems
    return []


def test_check_config_validates_the_interactivity_section(tmp_path: Path) -> None:
    roles = [{"name": "viewer", "users": ["U0VIEWER01"]}, {"name": "responder", "users": ["U0RESPOND1"]}]
    good = {"receiver": "slack", "signing_secret_file": str(tmp_path / "token"), "roles": roles}
    assert _config_problems(tmp_path, good) == []
    problems = "\n".join(
        _config_problems(tmp_path, {**good, "signing_secret_file": str(tmp_path / "missing")})
        + _config_problems(tmp_path, {**good, "permissions": {"ack": "oncall"}})
        + _config_problems(tmp_path, {**good, "roles": [{"name": "viewer", "users": ["alice"]}]})
        + _config_problems(tmp_path, {**good, "receiver": "email"})
        + _config_problems(tmp_path, good, with_alertmanager=False)
        + _config_problems(tmp_path, {**good, "socket_mode": True})
    )
    assert "interactivity.signing_secret_file: cannot read secret file" in problems
    assert "permissions.ack: 'oncall' is not a configured role" in problems
    assert "'alice' is not a Slack id" in problems
    assert "interactivity.receiver: 'email' is not a configured Slack receiver" in problems
    assert "interactivity: silences need the alertmanager section" in problems
    assert "app_token_file: Socket Mode needs the app-level token" in problems
    assert "is not an http(s) URL" in "\n".join(_config_problems(tmp_path, good, am_url="alertmanager:9093"))


async def test_a_registered_slow_command_answers_in_time_then_through_response_url(
    tmp_path: Path, slack: FakeSlack
) -> None:
    from bot.audit import AuditLog
    from bot.interact.dispatch import CommandSpec, Dispatcher, Invocation, Outcome
    from bot.interact.transport import ANSWER_WITHIN, Interactions

    release = asyncio.Event()

    async def slow(invocation: Invocation) -> Outcome:
        await release.wait()
        return Outcome(f"ran {escape(' '.join(invocation.args))}", "done", "restart-dcgm-exporter")

    config = InteractivityConfig.model_validate(
        {
            "receiver": "slack",
            "signing_secret_file": __file__,
            "roles": [{"name": "viewer"}, {"name": "responder"}, {"name": "admin", "users": ["U0RESPOND1"]}],
        }
    )
    clock = FakeClock()
    async with sqlite_store(tmp_path) as store:

        async def nobody(_group: str) -> list[str]:
            return []

        dispatcher = Dispatcher(Access(config, nobody, clock), AuditLog(store, clock))
        # What the remediation engine does: a command of its own, in the same table.
        dispatcher.add_command(CommandSpec("run", "run ACTION ID", "run an action", slow, "run", "admin"))
        interactions = Interactions(dispatcher, clock, f"{slack.url}/response/", timeout=2)
        answer = asyncio.create_task(
            interactions.command(command_fields("run restart <b>", response_url=slack.response_url()))
        )
        await eventually(lambda: clock.sleeping == 1)
        await clock.advance(ANSWER_WITHIN)
        assert (await answer)["text"] == "Working on it… the answer follows here."
        release.set()
        [late] = await eventually(lambda: slack.responses)
        assert late == {"response_type": "ephemeral", "text": "ran restart &lt;b&gt;"}
        await interactions.close()
        [entry] = await store.audit_log(datetime(2026, 1, 1, tzinfo=UTC))
        assert (entry.actor, entry.action, entry.target, entry.outcome) == (
            "slack:U0RESPOND1 alice",
            "run",
            "restart-dcgm-exporter",
            "done",
        )


async def test_a_failing_command_gets_an_answer_not_a_500(tmp_path: Path, slack: FakeSlack) -> None:
    from bot.audit import AuditLog
    from bot.interact.dispatch import CommandSpec, Dispatcher, Invocation, Outcome
    from bot.interact.transport import Interactions

    async def broken(_invocation: Invocation) -> Outcome:
        raise RuntimeError("a bug")

    async def nobody(_group: str) -> list[str]:
        return []

    config = InteractivityConfig.model_validate(
        {
            "receiver": "slack",
            "signing_secret_file": __file__,
            "roles": [{"name": "viewer"}, {"name": "responder"}],
        }
    )
    async with sqlite_store(tmp_path) as store:
        dispatcher = Dispatcher(Access(config, nobody, FakeClock()), AuditLog(store, FakeClock()))
        dispatcher.add_command(CommandSpec("broken", "broken", "fails", broken))
        interactions = Interactions(dispatcher, FakeClock(), f"{slack.url}/response/", timeout=2)
        assert (await interactions.command(command_fields("broken")))[
            "text"
        ] == "The command failed; see the bot's log."
        await interactions.close()


async def test_answers_go_to_slack_only(tmp_path: Path, slack: FakeSlack) -> None:
    from bot.interact.transport import Interactions

    async with sqlite_store(tmp_path):
        interactions = Interactions(_never_dispatched(), FakeClock(), f"{slack.url}/response/", timeout=2)
        await interactions.interaction(click_payload("ack", "k", "1.2", response_url="http://169.254.169.254/x"))
        assert slack.responses == []
        await interactions.close()


def _never_dispatched() -> Any:
    class Unused:
        async def click(self, *_args: object) -> str:
            return "answer"

    return Unused()


async def test_with_slack_unreachable_socket_mode_does_not_keep_the_bot_from_taking_webhooks(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = interactive_config(tmp_path, slack, ["http://127.0.0.1:9"], socket_mode=True)
    config["interactivity"]["app_token_file"] = str(tmp_path / "app_token")
    await slack.go_down()
    async with running_bot(tmp_path, config) as bot, aiohttp.ClientSession() as http:
        async with http.post(bot.webhook_url, json=webhook(gpu_alerts(1))) as response:
            assert response.status == 200
        assert not slack.socket_connected


_COMMAND_WORDS = st.sampled_from(["", "list ", "ack ", "unack ", "silence ", "unsilence ", "silences ", "help ", "x "])
_HOSTILE = st.text(alphabet=st.sampled_from(list("<>&!@#|=~\"' abcxyz019.*+()\\\n")), max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_COMMAND_WORDS, _HOSTILE)
def test_whatever_is_typed_the_answer_mentions_nobody_and_is_audited(
    tmp_path_factory: pytest.TempPathFactory, command: str, text: str
) -> None:
    asyncio.run(_answer_is_inert(tmp_path_factory.mktemp("store"), command + text))


async def _answer_is_inert(directory: Path, text: str) -> None:
    from bot.alertmanager import AlertmanagerClient
    from bot.audit import AuditLog
    from bot.interact.commands import AlertCommands
    from bot.interact.dispatch import Actor, Dispatcher

    config = InteractivityConfig.model_validate(
        {
            "receiver": "slack",
            "signing_secret_file": __file__,
            "roles": [{"name": "viewer"}, {"name": "responder", "users": ["U0RESPOND1"]}],
        }
    )

    async def nobody(_group: str) -> list[str]:
        return []

    clock = FakeClock()
    alertmanager = AlertmanagerClient(["http://127.0.0.1:9"], timeout=0.5)
    async with sqlite_store(directory) as store:
        dispatcher = Dispatcher(Access(config, nobody, clock), AuditLog(store, clock))
        AlertCommands(store, alertmanager, config, clock).register(dispatcher)
        answer = await dispatcher.command(Actor("U0RESPOND1", "alice"), text)
        assert answer and "<!" not in answer and "<@" not in answer and "<#" not in answer
        assert len(await store.audit_log(datetime(2026, 1, 1, tzinfo=UTC))) == 1
    await alertmanager.close()

"""Silences from Slack at their edges, on two real clustered Alertmanagers, two bot replicas on one real
PostgreSQL and the Slack fake with signed requests: a double click that lands on both replicas makes one silence,
Unsilence expires every silence the bot made for the alert, and a silence that would mute more than its alert says
so and waits for a confirmation."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.alertmanager import AlertmanagerClient, Silence, SilenceMatcher, SilenceState
from bot.interact.silences import silence_comment
from bot.models import AlertState, short_id
from tests.fakes.slack import FakeSlack
from tests.support.bot import RunningBot, eventually, running_bot
from tests.support.cluster import StartPair, to_every_bot
from tests.support.postgres import store_section
from tests.support.processes import Alertmanager, free_port
from tests.support.slack_requests import click_payload, command_fields, interactive_config, post_click, signed_headers

pytestmark = pytest.mark.realstack


@asynccontextmanager
async def replicas(
    tmp_path: Path, slack: FakeSlack, dsn: str, pair_of: StartPair
) -> AsyncIterator[tuple[list[RunningBot], list[Alertmanager]]]:
    """Two bot replicas on one PostgreSQL, both told by a clustered pair of Alertmanagers and silencing in it."""
    ports = [free_port(), free_port()]
    pair = pair_of(to_every_bot([f"http://127.0.0.1:{port}" for port in ports]), peer_timeout="2s")
    async with AsyncExitStack() as stack:
        bots = []
        for name, port in zip(("a", "b"), ports, strict=True):
            (tmp_path / name).mkdir()
            config = interactive_config(tmp_path / name, slack, [am.url for am in pair])
            config["store"] = store_section(tmp_path / name, dsn, name, receiver_lease="3s")
            bots.append(await stack.enter_async_context(running_bot(tmp_path / name, config, port=port)))
        yield bots, pair


def fire(pair: Sequence[Alertmanager], *labels: str) -> None:
    start = datetime.now(UTC).replace(microsecond=0).isoformat()
    for am in pair:  # Prometheus sends every alert to every Alertmanager
        am.amtool("alert", "add", *labels, f"--start={start}")


async def posted(bot: RunningBot, slack: FakeSlack, **labels: str) -> tuple[AlertState, str]:
    """The stored alert with exactly these labels (besides alertname), once its Slack message is posted, and that
    message's ts."""

    async def find() -> tuple[AlertState, str] | None:
        for alert in await bot.runtime.store.list_alerts("firing"):
            if {k: v for k, v in alert.labels.items() if k != "alertname"} == labels:
                roots = [m for m in slack.top_level() if alert.key in str(m.all_blocks)]
                if roots:
                    return alert, roots[0].ts
        return None

    found: tuple[AlertState, str] = await eventually(find, timeout=30)
    return found


async def live_silences(am: Alertmanager) -> list[Silence]:
    client = AlertmanagerClient([am.url])
    try:
        return [s for s in await client.silences() if s.state is not SilenceState.EXPIRED]
    finally:
        await client.close()


async def test_a_double_click_on_two_replicas_makes_one_silence_and_unsilence_expires_all_the_bots(
    tmp_path: Path,
    postgres_dsn: str,
    slack: FakeSlack,
    clustered_pair: StartPair,
) -> None:
    async with replicas(tmp_path, slack, postgres_dsn, clustered_pair) as (bots, pair):
        fire(pair, "GPUXidError", "host=k-ai-01", "gpu=3", "severity=critical")
        alert, ts = await posted(bots[0], slack, host="k-ai-01", gpu="3", severity="critical")
        sid = short_id(alert.key)
        # Two real clicks a few ms apart (each its own action_ts), one taken by each replica.
        clicks = [click_payload("silence-1h", alert.key, ts, response_url=slack.response_url(str(n))) for n in (1, 2)]
        statuses = await asyncio.gather(*(post_click(bot.url, c) for bot, c in zip(bots, clicks, strict=True)))
        assert statuses == [200, 200]
        await eventually(lambda: len(slack.responses) == 2, timeout=15)
        answers = sorted(r["text"] for r in slack.responses)
        assert answers[0].startswith(f"Silenced `{sid}` for 1 h: silence `"), answers
        assert answers[1].startswith(f"`{sid}` is already silenced by alice"), answers
        silence_id = answers[0].rsplit("`", 2)[-2]
        for am in pair:  # one silence, gossiped to both members
            assert [s.id for s in await eventually(lambda am=am: live_silences(am), timeout=15)] == [silence_id]

        # A silence the bot made for the alert and forgot (an earlier version's double click, or a crash between
        # making it and remembering it): Unsilence expires it too.
        client = AlertmanagerClient([pair[1].url])
        now = datetime.now(UTC)
        leftover = await client.create_silence(
            [SilenceMatcher(name="alertname", value="GPUXidError"), SilenceMatcher(name="host", value="k-ai-01")],
            starts_at=now,
            ends_at=now + timedelta(hours=1),
            created_by="alice",
            comment=silence_comment("", sid, "", "alice"),
        )
        await client.close()
        await eventually(lambda: _has(pair[0], leftover), timeout=15)  # gossiped to the member the bots ask first
        unsilence = click_payload("unsilence", alert.key, ts, response_url=slack.response_url("3"))
        assert await post_click(bots[1].url, unsilence) == 200
        await eventually(lambda: len(slack.responses) == 3, timeout=15)
        assert slack.responses[2]["text"] == (
            f"Expired silences `{silence_id}`, `{leftover}`: every one the bot made for `{sid}`."
        )
        for am in pair:
            assert await eventually(lambda am=am: _none_live(am), timeout=15)
        stored = await bots[0].runtime.store.get_alert(alert.key)
        assert stored is not None and stored.silence_id is None
        # Each request is audited once, by the replica that took it.
        entries = await bots[0].runtime.store.audit_log(now - timedelta(hours=1))
        assert sorted((e.action, e.outcome) for e in entries) == [
            ("silence-1h", "done"),
            ("silence-1h", "nothing"),
            ("unsilence", "done"),
        ]


async def _has(am: Alertmanager, silence_id: str) -> bool:
    return silence_id in {s.id for s in await live_silences(am)}


async def _none_live(am: Alertmanager) -> bool:
    return not await live_silences(am)


@asynccontextmanager
async def one_bot(
    tmp_path: Path, slack: FakeSlack, pair_of: StartPair
) -> AsyncIterator[tuple[RunningBot, list[Alertmanager]]]:
    port = free_port()
    pair = pair_of(to_every_bot([f"http://127.0.0.1:{port}"]), peer_timeout="2s")
    config = interactive_config(tmp_path, slack, [am.url for am in pair])
    async with running_bot(tmp_path, config, port=port) as bot:
        yield bot, pair


async def command(bot: RunningBot, text: str) -> dict[str, Any]:
    """A signed slash command's whole answer (its text, and its blocks when it offers a button)."""
    body = urllib.parse.urlencode(command_fields(text)).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{bot.url}/slack/commands", data=body, headers=signed_headers(body)) as response,
    ):
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


def offered(answer: dict[str, Any]) -> dict[str, Any]:
    [button] = [e for b in answer.get("blocks", []) if b["type"] == "actions" for e in b["elements"]]
    return button


async def muted(am: Alertmanager, **labels: str) -> bool:
    client = AlertmanagerClient([am.url])
    try:
        alerts = await client.alerts([f'{k}="{v}"' for k, v in labels.items()])
    finally:
        await client.close()
    matching = [a for a in alerts if a.labels == {**labels}]
    return bool(matching) and matching[0].status.state == "suppressed"


async def test_an_alert_without_host_labels_is_silenced_on_its_own_labels_and_wider_silences_are_confirmed(
    tmp_path: Path,
    slack: FakeSlack,
    clustered_pair: StartPair,
) -> None:
    async with one_bot(tmp_path, slack, clustered_pair) as (bot, pair):
        for cluster in ("east", "west"):
            fire(pair, "GPUFleetDegraded", f"cluster={cluster}")
        east, _ = await posted(bot, slack, cluster="east")
        await posted(bot, slack, cluster="west")
        sid = short_id(east.key)

        # silence_labels give only alertname here, which both clusters' alerts share: the silence takes the
        # alert's own labels instead, and mutes east alone.
        answer = (await command(bot, f"silence {sid} 1h"))["text"]
        assert answer.startswith(
            f'Silenced `{sid}` for 1 h on every label of the alert (alertname="GPUFleetDegraded", cluster="east"): '
            "its silence labels match other firing alerts too: silence `"
        ), answer
        [silence] = await live_silences(pair[0])
        assert [(m.name, m.value) for m in silence.matchers] == [("alertname", "GPUFleetDegraded"), ("cluster", "east")]
        assert await eventually(lambda: muted(pair[0], alertname="GPUFleetDegraded", cluster="east"), timeout=15)
        assert not await muted(pair[0], alertname="GPUFleetDegraded", cluster="west")

        # Typed matchers that mute both: said, nothing made until confirmed (the flag, or the offered button).
        asked = await command(bot, "silence alertname=GPUFleetDegraded 2h fleet work")
        assert asked["text"].startswith('alertname="GPUFleetDegraded" would mute 2 firing alerts: ')
        assert "`GPUFleetDegraded cluster=east`; `GPUFleetDegraded cluster=west`" in asked["text"]
        assert "Nothing was silenced." in asked["text"]
        assert "`silence alertname=GPUFleetDegraded 2h --confirm fleet work`" in asked["text"]
        assert len(await live_silences(pair[0])) == 1
        button = offered(asked)
        assert button["action_id"] == "silence-confirm" and button["text"]["text"] == "Silence all 2"
        click = click_payload(button["action_id"], button["value"], "1.0", response_url=slack.response_url())
        assert await post_click(bot.url, click) == 200
        [done] = await eventually(lambda: slack.responses, timeout=15)
        assert done["text"].startswith('Silenced alertname="GPUFleetDegraded" for 2 h, muting 2 firing alerts')
        await eventually(lambda: _count(pair[0], 2), timeout=15)
        flagged = await command(bot, "silence alertname=GPUFleetDegraded cluster=west 1h --confirm")
        assert flagged["text"].startswith('Silenced alertname="GPUFleetDegraded", cluster="west" for 1 h: silence')

        entries = await bot.runtime.store.audit_log(datetime.now(UTC) - timedelta(hours=1))
        assert [(e.action, e.outcome) for e in entries] == [
            ("silence", "done"),
            ("silence", "confirm"),
            ("silence-confirm", "done"),
            ("silence", "done"),
        ]


async def test_a_silence_button_that_would_mute_another_alert_asks_first(
    tmp_path: Path,
    slack: FakeSlack,
    clustered_pair: StartPair,
) -> None:
    async with one_bot(tmp_path, slack, clustered_pair) as (bot, pair):
        fire(pair, "GPUPartitionDegraded", "team=ml")
        fire(pair, "GPUPartitionDegraded", "team=ml", "cluster=east")  # has every label of the first, and more
        alert, ts = await posted(bot, slack, team="ml")
        await posted(bot, slack, team="ml", cluster="east")
        sid = short_id(alert.key)
        await post_click(bot.url, click_payload("silence-4h", alert.key, ts, response_url=slack.response_url()))
        [asked] = await eventually(lambda: slack.responses, timeout=15)
        assert asked["text"].startswith(
            f'Silencing `{sid}` on alertname="GPUPartitionDegraded", team="ml" would also mute 1 other firing alert: '
            "`GPUPartitionDegraded cluster=east team=ml`. Nothing was silenced."
        ), asked["text"]
        assert f"`silence {sid} 4h --confirm`" in asked["text"]
        assert await live_silences(pair[0]) == []
        button = offered(asked)
        await post_click(
            bot.url, click_payload(button["action_id"], button["value"], ts, response_url=slack.response_url())
        )
        await eventually(lambda: len(slack.responses) == 2, timeout=15)
        assert slack.responses[1]["text"].startswith(f"Silenced `{sid}` for 4 h on every label of the alert"), (
            slack.responses[1]["text"]
        )
        assert ", muting 1 other firing alert too: silence `" in slack.responses[1]["text"]
        stored = await bot.runtime.store.get_alert(alert.key)
        assert stored is not None and stored.silence_id is not None


async def _count(am: Alertmanager, n: int) -> bool:
    return len(await live_silences(am)) == n

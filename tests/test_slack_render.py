"""Slack rendering: what the message shows, and that no message content can break Block Kit's limits or
inject mrkdwn (mentions, links) through label or annotation values."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bot.message import ActionRef, Fact, Link, Message, Section
from bot.render.slack import (
    MAX_TOTAL_TEXT,
    Controls,
    RelatedNote,
    repeat_note,
    resolved_note,
    shrink_for_slack,
    slack_payload,
)
from bot.render.slack.incident import incident_card
from bot.render.slack.incident_thread import HOSTS_PER_REPLY, gpus_text, hosts_reply
from tests.fakes.slack import block_kit_errors
from tests.support.fleet_incidents import fleet_view

STARTED = datetime(2026, 11, 29, 13, 30, tzinfo=UTC)


def message(**changes: Any) -> Message:
    fields: dict[str, Any] = {
        "alert_key": "3f2a@2026-11-29T13:30:00+00:00",
        "fingerprint": "3f2a",
        "group_key": "g",
        "event": "firing",
        "status": "firing",
        "severity": "critical",
        "title": "GPUXidError on k-ai-01 GPU 3",
        "summary": "Xid 79 on GPU 3: fallen off the bus",
        "host": "k-ai-01",
        "gpu": "3",
        "alertname": "GPUXidError",
        "starts_at": STARTED,
        "facts": [
            Fact(label="Host", value="k-ai-01"),
            Fact(label="GPU", value="3 · NVIDIA H100 80GB HBM3 · GPU-8c1e · 00000000:3B:00.0"),
            Fact(label="Value", value="79"),
            Fact(label="Started", value="2026-11-29 13:30:00 UTC"),
        ],
        "sections": [
            Section(title="Evidence", lines=["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."]),
            Section(title="Judgement", kind="judgement", lines=["Hardware fault: drain the node"]),
            Section(title="Runbook", kind="steps", lines=["Drain the node", "Reset the GPU", "Open an RMA"]),
            Section(title="Kernel log", kind="code", lines=["[12.3] NVRM: Xid 79", "[12.4] NVRM: GPU lost"]),
        ],
        "links": [
            Link(text="Runbook", url="https://wiki.example.com/xid?code=79&gpu=3"),
            Link(text="Grafana", url="http://grafana:3000/d/gpu?var-host=k-ai-01"),
        ],
        "actions": [ActionRef(name="silence_1h", label="Silence 1h"), ActionRef(name="reset_gpu", label="Reset GPU")],
        "labels": {"alertname": "GPUXidError", "host": "k-ai-01", "gpu": "3", "severity": "critical"},
    }
    fields.update(changes)
    return Message(**fields)


def blocks(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(payload.get("blocks", [])) + [b for a in payload.get("attachments", []) for b in a["blocks"]]


def texts(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "text" and isinstance(v, str)] + [
            t for k, v in node.items() if k != "text" or not isinstance(v, str) for t in texts(v)
        ]
    if isinstance(node, list):
        return [t for item in node for t in texts(item)]
    return []


def test_firing_message_shows_severity_facts_sections_links_and_buttons() -> None:
    payload = slack_payload(message(), controls=Controls(interactive=True, executable=frozenset({"reset_gpu"})))
    attachment = payload["attachments"][0]
    assert attachment["color"] == "#D92D20"
    assert payload["text"].startswith("🔴 [CRITICAL] GPUXidError on k-ai-01 GPU 3")
    kinds = [b["type"] for b in attachment["blocks"]]
    assert kinds[0] == "header" and "actions" in kinds
    fields = next(b["fields"] for b in attachment["blocks"] if "fields" in b)
    assert [f["text"].split("\n")[0] for f in fields] == ["*Host*", "*GPU*", "*Value*", "*Started*"]
    body = [b["text"]["text"] for b in attachment["blocks"] if b["type"] == "section" and "text" in b]
    # Judgement first, runbook as a numbered list, log lines in a code block.
    assert body[1].startswith("*Judgement*")
    assert "1. Drain the node\n2. Reset the GPU\n3. Open an RMA" in "\n".join(body)
    assert "```\n[12.3] NVRM: Xid 79\n[12.4] NVRM: GPU lost\n```" in "\n".join(body)
    links = "\n".join(texts(attachment["blocks"]))
    assert "<https://wiki.example.com/xid?code=79&amp;gpu=3|Runbook>" in links
    buttons = next(b for b in attachment["blocks"] if b["type"] == "actions")["elements"]
    assert [(b["action_id"], b["value"]) for b in buttons] == [
        (action_id, message().alert_key)
        for action_id in ("ack", "silence-1h", "silence-4h", "silence-24h", "runbook", "reset_gpu")
    ]
    assert block_kit_errors(payload) == []


def test_resolved_message_is_green_and_says_how_long() -> None:
    resolved = message(status="resolved", event="resolved", resolved_at=STARTED + timedelta(minutes=12), actions=[])
    payload = slack_payload(resolved)
    assert payload["attachments"][0]["color"] == "#12B76A"
    assert payload["text"].startswith("✅ Resolved after 12 min")
    assert "*Resolved after 12 min*" in "\n".join(texts(payload))
    assert not [b for b in blocks(payload) if b["type"] == "actions"]


def test_severity_colours_and_ack_state() -> None:
    assert slack_payload(message(severity="warning"))["attachments"][0]["color"] == "#F79009"
    assert slack_payload(message(severity="info"))["attachments"][0]["color"] == "#2E90FA"
    acked = slack_payload(message(acked_by="alice"))
    assert "acknowledged by *alice*" in "\n".join(texts(acked))


def test_related_alerts_are_mentioned_on_the_root() -> None:
    payload = slack_payload(message(), related=[RelatedNote("GPUTempHigh on k-ai-01 GPU 3", "resolved")])
    assert "related in thread: GPUTempHigh on k-ai-01 GPU 3 (resolved)" in "\n".join(texts(payload))


def test_compact_keeps_the_essentials_only() -> None:
    full = "\n".join(texts(slack_payload(message())))
    compact = "\n".join(texts(slack_payload(message(), compact=True)))
    assert "Judgement" in compact and "Runbook" in full
    assert "Reset the GPU" not in compact and "NVRM: GPU lost" not in compact


def test_label_values_cannot_mention_or_link() -> None:
    hostile = "<!channel> <@U123> <https://evil.example|click> & more"
    payload = slack_payload(
        message(
            title=f"GPUXidError on {hostile}",
            summary=hostile,
            host=hostile,
            facts=[Fact(label="Host", value=hostile)],
            sections=[Section(title=hostile, kind="code", lines=[hostile])],
            labels={"host": hostile},
            links=[Link(text=hostile, url="javascript:alert(1)")],
        )
    )
    rendered = "\n".join(texts(payload)) + payload["text"]
    assert "<!channel>" not in rendered and "<@U123>" not in rendered and "<https://evil" not in rendered
    assert "&lt;!channel&gt;" in rendered
    # "@channel" or "#ops" typed as plain text are left as text only where Slack's automatic parsing is off.
    assert all(obj.get("verbatim") is True for obj in _text_objects(payload) if obj["type"] == "mrkdwn")


def _text_objects(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        own = [node] if node.get("type") in ("mrkdwn", "plain_text") else []
        return own + [obj for value in node.values() for obj in _text_objects(value)]
    if isinstance(node, list):
        return [obj for item in node for obj in _text_objects(item)]
    return []


def test_log_lines_cannot_close_the_code_block() -> None:
    payload = slack_payload(message(sections=[Section(title="Log", kind="code", lines=["a ``` *bold*", "b"])]))
    code = next(t for t in texts(payload) if t.startswith("*Log*"))
    assert code.count("```") == 2


def test_thread_notes() -> None:
    assert "still firing, seen 4 times" in repeat_note(message(times_seen=4), STARTED)["text"]
    resolved = message(status="resolved", resolved_at=STARTED + timedelta(minutes=12))
    assert "resolved after 12 min" in resolved_note(resolved)["text"]


def test_an_incident_card_and_its_host_replies_stay_within_limits_whatever_they_hold() -> None:
    hostile = "<!channel> " + "x" * 400
    view = fleet_view(hosts=HOSTS_PER_REPLY, gpus=64, analysed=True)
    cause = view.cause.model_copy(  # type: ignore[union-attr]
        update={"title": hostile, "reason": hostile * 20, "steps": [hostile * 10] * 30, "runbook_url": "javascript:x"}
    )
    trait = view.traits[0].model_copy(update={"label": hostile, "value": hostile * 10})
    hosts = [
        h.model_copy(update={"host": f"{hostile}{n}", "gpus": [hostile] * 8 + h.gpus}) for n, h in enumerate(view.hosts)
    ]
    view = view.model_copy(update={"title": hostile * 3, "cause": cause, "traits": [trait] * 40, "hosts": hosts})
    controls = Controls(interactive=True, executable=frozenset({"lower-power-limit"}))
    for payload in (incident_card(view, controls), hosts_reply(view, [h.host for h in hosts], 1)):
        assert block_kit_errors(payload) == []
        assert not any("<!channel>" in text for text in texts(payload))


def test_a_card_claims_no_trait_or_cause_the_evidence_did_not_find() -> None:
    view = fleet_view(hosts=40, analysed=True).model_copy(update={"traits": [], "cause": None, "signals": []})
    text = "\n".join(texts(incident_card(view)))
    assert "*What they share:* Nothing stands out: the affected hosts look like any hosts of the fleet." in text
    assert "Likely cause:* none the data points at" in text and "Looking for" not in text
    # Without the fleet, nothing is said of what the hosts share, and why it was not read says what to check.
    blind = view.model_copy(update={"scope": view.scope.model_copy(update={"fleet_hosts": None, "fleet_gpus": None})})
    said = {
        "none": "Not known: no Prometheus is configured (enrichment.prometheus)",
        "unanswered": "Not known: Prometheus did not answer, so the hosts were compared with nothing; check",
        "empty": "Not known: Prometheus answered but holds no GPU series (DCGM_FI_DEV_GPU_TEMP)",
    }
    for fleet, words in said.items():
        told = "\n".join(texts(incident_card(blind.model_copy(update={"fleet": fleet}))))
        assert f"*What they share:* {words}" in told and "look like any" not in told, fleet
    young = "\n".join(texts(incident_card(fleet_view(hosts=40))))
    assert "Looking for what the affected hosts share" in young and "Likely cause" not in young


def test_a_hosts_reply_holds_its_hosts_and_collapses_their_gpus() -> None:
    view = fleet_view(hosts=150)
    reply = hosts_reply(view, [h.host for h in view.hosts[:HOSTS_PER_REPLY]], 1)
    listed = "\n".join(texts(reply["blocks"]))
    assert block_kit_errors(reply) == [] and len(listed.splitlines()) == HOSTS_PER_REPLY
    assert "`k-ai-000` · GPUs 0-7 · 93-95 °C · ids `" in listed
    assert gpus_text(["7", "0", "1", "2", "3", "5", "mig-1"]) == "GPUs 0-3, 5, 7, mig-1"
    assert gpus_text(["2"]) == "GPU 2"


def test_shrunk_message_renders_the_same() -> None:
    big = message(sections=[Section(title="Log", kind="code", lines=[f"line {n}" for n in range(5000)])])
    small = shrink_for_slack(big.model_copy(update={"details": {"loki": {"entries": ["x"] * 5000}}}))
    assert small.details == {}
    assert len(small.model_dump_json()) < 20000
    assert blocks(slack_payload(small))[:4] == blocks(slack_payload(big))[:4]


# --- property: any content renders valid, escaped Block Kit ---------------------------------------------------
_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=4000)
_short = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300)
_url = st.one_of(
    st.builds(lambda path: f"https://grafana.example.com/{path}", _short), _short, st.just("https://x/" + "a" * 3100)
)
_section = st.builds(
    Section,
    title=_short,
    kind=st.sampled_from(["text", "steps", "code", "judgement", "warning"]),
    lines=st.lists(_text, max_size=60),
)
_messages = st.builds(
    message,
    title=_text,
    summary=_text,
    severity=st.sampled_from(["critical", "warning", "info", "", "weird"]),
    status=st.sampled_from(["firing", "resolved"]),
    times_seen=st.integers(1, 10**6),
    acked_by=st.one_of(st.none(), _short),
    facts=st.lists(st.builds(Fact, label=_short, value=_text), max_size=14),
    sections=st.lists(_section, max_size=70),
    links=st.lists(st.builds(Link, text=_short, url=_url), max_size=12),
    actions=st.lists(
        st.builds(ActionRef, name=_short, label=_short, safety=st.sampled_from(["safe", "guarded", "dangerous"])),
        max_size=30,
    ),
    labels=st.dictionaries(_short, _text, max_size=40),
)

_MENTION = re.compile(r"<[!@#]")
_HUGE = "<!here> & " + "ü😀" * 2500
_HUGE_MESSAGE = message(
    title=_HUGE,
    summary=_HUGE,
    acked_by=_HUGE,
    facts=[Fact(label=_HUGE, value=_HUGE)] * 14,
    sections=[Section(title=_HUGE, kind=kind, lines=[_HUGE] * 60) for kind in ("code", "steps", "text") * 25],
    links=[Link(text=_HUGE, url="https://x.example/?q=" + "a&b|c>" * 400)] * 12,
    actions=[ActionRef(name=f"a{n}" * 200, label=_HUGE, safety="dangerous") for n in range(30)],
    labels={f"label{n}": _HUGE for n in range(40)},
)


def _as_linked(url: str) -> str:
    """A URL as a mrkdwn link's target says it, but for its `&`: `|`, `<` and `>` percent-encoded (`%3C` in a URL
    already means `<`)."""
    return url.replace("|", "%7C").replace("<", "%3C").replace(">", "%3E")


def _unescape_link(target: str) -> str:
    """A rendered link's target with its `&` unescaped (an `&amp;` of the URL itself was rendered `&amp;amp;`)."""
    return _as_linked(target.replace("&amp;", "&"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_messages, st.booleans())
@example(_HUGE_MESSAGE, False)
@example(_HUGE_MESSAGE.model_copy(update={"status": "resolved"}), True)
@example(message(links=[Link(text="", url="https://grafana.example.com/%3C")]), False)
@example(message(links=[Link(text="", url="https://grafana.example.com/&amp;")]), False)
def test_any_message_renders_valid_escaped_block_kit(msg: Message, compact: bool) -> None:
    related = [RelatedNote(msg.title, "firing")] * 7
    controls = Controls(interactive=True, executable=frozenset(action.name for action in msg.actions))
    payload = slack_payload(msg, compact=compact, related=related, controls=controls)
    assert block_kit_errors(payload) == []
    assert sum(len(t) for t in texts(blocks(payload))) <= MAX_TOTAL_TEXT
    allowed_links = {_as_linked(link.url) for link in msg.links}
    for text in [*texts(blocks(payload)), payload["text"]]:
        assert not _MENTION.search(text)
        for target in re.findall(r"<([^>|]*)\|", text):
            # Every link is one of the message's own http(s) links, escaped for mrkdwn.
            assert _unescape_link(target) in allowed_links and target.startswith(("http://", "https://"))
        assert "<" not in re.sub(r"<https?://[^>|]*\|[^>]*>", "", text)


def test_no_button_without_interactivity_nor_for_an_action_nothing_can_run() -> None:
    assert not [b for b in blocks(slack_payload(message())) if b["type"] == "actions"]
    shown = slack_payload(message(), controls=Controls(interactive=True))
    [actions] = [b for b in blocks(shown) if b["type"] == "actions"]
    assert "reset_gpu" not in [button["action_id"] for button in actions["elements"]]


def test_buttons_follow_the_alert_state() -> None:
    controls = Controls(interactive=True)
    acked = message(
        acked_by="alice", acked_at=STARTED, silence_id="1c15d9a4", silenced_by="bob", silenced_until=STARTED
    )
    [actions] = [b for b in blocks(slack_payload(acked, controls=controls)) if b["type"] == "actions"]
    assert [button["action_id"] for button in actions["elements"]] == ["unack", "unsilence", "runbook"]
    status = "\n".join(texts(slack_payload(acked, controls=controls)))
    assert "acknowledged by *alice* at 2026-11-29" in status and "silenced by *bob* until" in status
    [fresh] = [b for b in blocks(slack_payload(message(), controls=controls)) if b["type"] == "actions"]
    day = next(button for button in fresh["elements"] if button["action_id"] == "silence-24h")
    assert "confirm" in day and "confirm" not in fresh["elements"][1]
    resolved = message(status="resolved", event="resolved", resolved_at=STARTED + timedelta(minutes=3))
    assert not [b for b in blocks(slack_payload(resolved, controls=controls)) if b["type"] == "actions"]

"""What the approval message of a remediation run says in each state, and when it has buttons."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.interact.approval import approval_text
from bot.render.slack import approval_payload
from bot.storage.interface import ActionRun

AT = datetime(2026, 11, 30, 22, 5, tzinfo=UTC)


def run(state: str, approvals: tuple[str, ...] = (), detail: str = "") -> ActionRun:
    return ActionRun(
        7, "drain-node", "k", "k-ai-01", None, "slack:U0ALICE01 alice", False, False, state, AT, AT, approvals, detail
    )


def test_a_waiting_run_names_who_asked() -> None:
    assert (
        approval_text(run("requested"))
        == "<@U0ALICE01> asks for *drain-node* on k-ai-01 (run #7). It waits for approval."
    )


def test_a_first_approval_of_a_dangerous_run_says_a_second_approver_is_needed() -> None:
    text = approval_text(run("requested", ("slack:U0ADMIN001 ada",)))
    assert text.endswith("approved by <@U0ADMIN001> at 2026-11-30 22:05 UTC; a second approver is needed.")


def test_decisions_name_who_decided_and_when() -> None:
    both = approval_text(run("approved", ("slack:U0ADMIN001 ada", "cli:bob")))
    assert both.endswith("approved by <@U0ADMIN001>, cli:bob at 2026-11-30 22:05 UTC.")
    refused = approval_text(run("refused", detail="refused by slack:U0ADMIN001 ada"))
    assert refused.endswith("refused by <@U0ADMIN001> at 2026-11-30 22:05 UTC.")
    assert "expired at 2026-11-30 22:05 UTC" in approval_text(run("expired"))


def test_a_crafted_actor_name_is_escaped_not_a_mention() -> None:
    assert approval_text(run("approved", ("cli:<!channel>",))).endswith(
        "approved by cli:&lt;!channel&gt; at 2026-11-30 22:05 UTC."
    )


def test_buttons_carry_the_run_number_only_while_something_is_left_to_decide() -> None:
    open_ = approval_payload("text", 7, open_=True)["blocks"][-1]
    assert [(e["action_id"], e["value"]) for e in open_["elements"]] == [("approve-run", "7"), ("refuse-run", "7")]
    assert all(block["type"] != "actions" for block in approval_payload("text", 7, open_=False)["blocks"])

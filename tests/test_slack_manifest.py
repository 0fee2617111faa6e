"""The Slack app manifests of docs/slack.md carry every bot scope the code needs: each Slack Web API method the
bot's source calls (found in the source, so a new call without its scope fails here) and the slash command."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import yaml
from slack_sdk.web.async_client import AsyncWebClient

ROOT = Path(__file__).resolve().parent.parent
# Slack's documented bot scopes per method, for the conversation types the bot uses (public and private
# channels, `types="public_channel,private_channel"`). auth.test needs none.
SCOPES: dict[str, set[str]] = {
    "auth_test": set(),
    "chat_postMessage": {"chat:write"},
    "chat_update": {"chat:write"},
    "chat_postEphemeral": {"chat:write"},
    "conversations_history": {"channels:history", "groups:history"},
    "conversations_replies": {"channels:history", "groups:history"},
    "conversations_info": {"channels:read", "groups:read"},
    "conversations_list": {"channels:read", "groups:read"},
    "files_getUploadURLExternal": {"files:write"},
    "files_completeUploadExternal": {"files:write"},
    "usergroups_users_list": {"usergroups:read"},
}


def called_slack_methods() -> set[str]:
    """Every `x.NAME(...)` in bot/ whose NAME is a method of slack_sdk's Web API client."""
    found: set[str] = set()
    for path in (ROOT / "bot").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                if "_" in name and not name.startswith("_") and callable(getattr(AsyncWebClient, name, None)):
                    found.add(name)
    return found - {"api_call"}


def manifests() -> Iterator[dict[str, object]]:
    text = (ROOT / "docs" / "slack.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
        document = yaml.safe_load(block)
        if isinstance(document, dict) and "oauth_config" in document:
            yield document


def test_the_source_scan_finds_the_calls_it_should() -> None:
    # The scan itself: the sink's posts, the upload flow and the role lookups are found.
    assert {"chat_postMessage", "files_completeUploadExternal", "usergroups_users_list"} <= called_slack_methods()


def test_every_manifest_grants_every_scope_the_code_needs() -> None:
    called = called_slack_methods()
    unknown = called - SCOPES.keys()
    assert not unknown, f"the bot calls {sorted(unknown)}: add the scopes Slack documents for them to SCOPES"
    needed = set().union(*(SCOPES[method] for method in called)) | {"commands"}
    found = list(manifests())
    assert len(found) == 2
    for manifest in found:
        oauth = manifest["oauth_config"]
        assert isinstance(oauth, dict)
        granted = set(oauth["scopes"]["bot"])
        assert needed - granted == set(), manifest["display_information"]

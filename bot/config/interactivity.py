"""The `interactivity` section: Slack commands and buttons, roles and permissions."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from bot.config.base import StrictModel
from bot.config.duration import Duration
from bot.config.secrets import SecretFile

_SLACK_USER_ID = re.compile(r"^[UW][A-Z0-9]{2,}$")
_SLACK_GROUP_ID = re.compile(r"^S[A-Z0-9]{2,}$")
# Who may use each command (and the buttons that do the same) unless `permissions` says otherwise.
DEFAULT_PERMISSIONS: Mapping[str, str] = {
    "list": "viewer",
    "silences": "viewer",
    "status": "viewer",
    "ack": "responder",
    "unack": "responder",
    "silence": "responder",
    "unsilence": "responder",
}
# Who may use remediation from Slack unless `permissions` says otherwise (bot/interact/remediation.py).
REMEDIATION_PERMISSIONS: Mapping[str, str] = {
    "run": "responder",
    "approve": "responder",
    "run-dangerous": "admin",
    "approve-dangerous": "admin",
    "reset-breaker": "admin",
}


def _slack_ids(pattern: re.Pattern[str], example: str) -> Any:
    def check(values: list[str]) -> list[str]:
        for value in values:
            if not pattern.match(value):
                raise ValueError(f"{value!r} is not a Slack id such as {example} (a name is not an id)")
        return values

    return AfterValidator(check)


class SlackRole(StrictModel):
    name: str = Field(min_length=1)
    users: Annotated[list[str], _slack_ids(_SLACK_USER_ID, "U024BE7LH")] = Field(default_factory=list)
    groups: Annotated[list[str], _slack_ids(_SLACK_GROUP_ID, "S0614TZR7")] = Field(default_factory=list)


class InteractivityConfig(StrictModel):
    """Slack commands and buttons. Roles are listed from least to most powerful: each may do what those before it
    may. `permissions` names, per command, the least role that may use it; a role it names must be configured,
    while a default permission whose role is not configured grants nothing (viewer, responder and admin alike)."""

    enabled: bool = True
    # The Slack receiver whose messages carry the buttons; its bot token answers and reads user groups.
    receiver: str = Field(min_length=1)
    signing_secret_file: SecretFile | None = None
    socket_mode: bool = False
    app_token_file: SecretFile | None = None
    # Where delayed answers may be posted: Slack's response_url must start with this.
    response_url_prefix: str = "https://hooks.slack.com/"
    timeout: Duration = 10.0
    roles: list[SlackRole] = Field(min_length=1)
    permissions: dict[str, str] = Field(default_factory=dict)
    silence_labels: list[str] = Field(default_factory=lambda: ["alertname", "host", "instance", "gpu"], min_length=1)
    max_silence: Duration = 7 * 86400.0
    silence_check_interval: Duration = 60.0
    group_cache: Duration = 300.0

    @model_validator(mode="after")
    def _consistent(self) -> InteractivityConfig:
        problems = []
        if self.socket_mode and self.app_token_file is None:
            problems.append("app_token_file: Socket Mode needs the app-level token (xapp-...) from a file")
        if not self.socket_mode and self.signing_secret_file is None:
            problems.append("signing_secret_file: Slack's requests are verified with the app's signing secret")
        names = [role.name for role in self.roles]
        if len(set(names)) != len(names):
            problems.append("roles: a role name is used twice")
        # A role `permissions` names is surely meant to exist (a typo locks people out): refused. A default's role
        # that is not configured grants nothing, whichever role it is (`unconfigured_roles` says what that locks).
        known = sorted({*DEFAULT_PERMISSIONS, *REMEDIATION_PERMISSIONS})
        for command, role in self.permissions.items():
            if command not in known:
                close = difflib.get_close_matches(command, known, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                problems.append(f"permissions.{command}: not a permission ({hint}permissions: {', '.join(known)})")
            elif role not in names:
                problems.append(f"permissions.{command}: {role!r} is not a configured role (roles: {', '.join(names)})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def effective_permissions(self) -> dict[str, str]:
        return {**DEFAULT_PERMISSIONS, **REMEDIATION_PERMISSIONS, **self.permissions}

    def unconfigured_roles(self, remediation: bool) -> dict[str, list[str]]:
        """Per role that a permission in use names but `roles` does not configure, those permissions: nobody may
        use them from Slack (`remediation`: its permissions are in use)."""
        names = {role.name for role in self.roles}
        used = {**DEFAULT_PERMISSIONS, **(REMEDIATION_PERMISSIONS if remediation else {}), **self.permissions}
        missing: dict[str, list[str]] = {}
        for permission, role in used.items():
            if role not in names:
                missing.setdefault(role, []).append(permission)
        return missing

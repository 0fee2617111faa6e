"""The `receivers` section: console, Slack, email and PagerDuty."""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, TypeAdapter, ValidationError, field_validator, model_validator

from bot.config.base import ConfigPath, HttpUrlText, StrictModel, host_port
from bot.config.duration import Duration
from bot.config.secrets import Secret, SecretFile

_BOOL = TypeAdapter(bool)
# Slack tokens that are not a bot's, by their prefix: what each is, as a refusal says it.
_NOT_BOT_TOKENS = {
    "xoxp": "a Slack user token (xoxp-...), which posts as the person who installed the app",
    "xapp": "an app-level token (xapp-...), which only opens Socket Mode (interactivity.app_token_file)",
}
GraphTheme = Literal["light", "dark"]


def _smarthost(value: Any) -> str:
    return host_port(value, "smtp.example.com:587")


class ConsoleReceiver(StrictModel):
    type: Literal["console"]
    name: str = Field(min_length=1)


class SlackReceiver(StrictModel):
    type: Literal["slack"]
    name: str = Field(min_length=1)
    channel: str = Field(min_length=1)
    token_file: SecretFile
    api_url: HttpUrlText = "https://slack.com/api/"
    timeout: Duration = 10.0
    messages_per_second: float = Field(default=1.0, gt=0)
    # The metric's history as a picture in the alert's thread (needs files:write); unset: on when the `graphs`
    # extra (matplotlib) is installed.
    graphs: bool | None = None
    graph_theme: GraphTheme = "light"

    @field_validator("token_file")
    @classmethod
    def _a_bot_token(cls, token: Secret) -> Secret:
        kind = _NOT_BOT_TOKENS.get(token.get().split("-", 1)[0])
        if kind is not None:
            raise ValueError(
                f"{token.path} holds {kind}: a receiver posts with the Slack app's bot token (xoxb-..., "
                "Slack app > OAuth & Permissions > Bot User OAuth Token)"
            )
        return token

    @model_validator(mode="before")
    @classmethod
    def _no_storm_keys(cls, value: Any) -> Any:
        old = sorted({"storm_threshold", "storm_window"} & set(value)) if isinstance(value, Mapping) else []
        if old:
            raise ValueError(
                f"{' and '.join(old)}: a Slack receiver no longer groups alerts itself; many alerts with one cause "
                "are one incident for every receiver, set in the `incidents` section (threshold, window)"
            )
        return value


class EmailReceiver(StrictModel):
    type: Literal["email"]
    name: str = Field(min_length=1)
    to: list[str] = Field(min_length=1)
    sender: str = Field(alias="from", min_length=3)
    smarthost: Annotated[str, PlainValidator(_smarthost)]
    security: Literal["starttls", "tls", "none"] = "starttls"
    # Sending without TLS is refused unless this is set, for a relay on the same host or network.
    allow_plaintext: bool = False
    username: str | None = None
    password_file: SecretFile | None = None
    ca_file: ConfigPath | None = None
    timeout: Duration = 30.0
    # An incident is one mail, then at most one digest of what changed per digest_interval, then its recovery.
    digest_interval: Duration = Field(default=300.0, gt=0)
    # The metric's history as a picture inline in the HTML part; unset: on when matplotlib is installed.
    graphs: bool | None = None
    graph_theme: GraphTheme = "light"

    @model_validator(mode="after")
    def _plaintext_is_explicit(self) -> EmailReceiver:
        problems = email_problems(self.model_dump(by_alias=True))
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @field_validator("to")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            _check_address(address)
        return value

    @field_validator("sender")
    @classmethod
    def _sender_address(cls, value: str) -> str:
        _check_address(value)
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"CA file {value} not found")
        return value


def email_problems(receiver: Mapping[str, Any]) -> list[str]:
    """Checks across an email receiver's keys, on the receiver as a mapping: the validated one, or the file's
    when one of its keys is invalid (so these are reported with that key's error). What cannot be told from
    invalid values is not checked."""
    security = receiver.get("security", "starttls")
    try:
        plaintext = _BOOL.validate_python(receiver.get("allow_plaintext", False))
    except ValidationError:
        return []
    if security not in ("starttls", "tls", "none"):
        return []
    username, password = receiver.get("username") is not None, receiver.get("password_file") is not None
    problems = []
    if security == "none" and not plaintext:
        problems.append("security: none sends mail in clear text; set allow_plaintext: true to accept that")
    if security != "none" and plaintext:
        problems.append(
            f"allow_plaintext only applies to security: none; with {security} a server without TLS is refused"
        )
    if username != password:
        problems.append("username and password_file go together")
    if security == "none" and username:
        problems.append("SMTP AUTH without TLS would send the password in clear text; use starttls or tls")
    return problems


def _check_address(value: str) -> None:
    """An address such as `oncall@example.com` or `GPU alerts <oncall@example.com>`."""
    _display, address = email.utils.parseaddr(value)
    local, at, domain = address.rpartition("@")
    if not (local and at and domain) or any(c.isspace() for c in address):
        raise ValueError(f"{value!r} is not an email address such as oncall@example.com")


PagerDutySeverity = Literal["critical", "error", "warning", "info"]


def _default_severity_map() -> dict[str, PagerDutySeverity]:
    return {"critical": "critical", "error": "error", "warning": "warning", "info": "info"}


class PagerDutyReceiver(StrictModel):
    type: Literal["pagerduty"]
    name: str = Field(min_length=1)
    routing_key_file: SecretFile
    url: HttpUrlText = "https://events.pagerduty.com/v2/enqueue"
    timeout: Duration = 10.0
    client: str = "gpu-alert-bot"
    client_url: HttpUrlText | None = None
    # Alert `severity` label (any case) -> PagerDuty severity; labels missing from the map get default_severity.
    severity_map: dict[str, PagerDutySeverity] = Field(default_factory=_default_severity_map)
    default_severity: PagerDutySeverity = "error"
    # Wait after a 429 before the next attempt; PagerDuty asks for a backoff of minutes rather than seconds.
    rate_limit_delay: Duration = 60.0
    # Page with the severity a verdict lowered the message to (a stale Xid gauge: info) instead of the alert's own.
    downgrade_on_verdict: bool = False

    @field_validator("routing_key_file")
    @classmethod
    def _integration_key(cls, value: Secret) -> Secret:
        if len(value.get()) != 32:
            raise ValueError(f"{value.path} must hold a 32-character Events API v2 integration key")
        return value

    @field_validator("severity_map")
    @classmethod
    def _case_insensitive(cls, value: dict[str, PagerDutySeverity]) -> dict[str, PagerDutySeverity]:
        return {label.lower(): severity for label, severity in value.items()}


Receiver = Annotated[ConsoleReceiver | SlackReceiver | EmailReceiver | PagerDutyReceiver, Field(discriminator="type")]

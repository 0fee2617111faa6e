"""The `alertmanager` section (its API, for silences and the self-test) and the dead man's switch."""

from __future__ import annotations

import re
import urllib.parse
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from bot.config.base import StrictModel
from bot.config.duration import Duration
from bot.config.secrets import SecretFile

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _http_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL such as http://alertmanager:9093")
    return value


class AlertmanagerConfig(StrictModel):
    """Alertmanager's API v2, for silences and the self-test. Several URLs: an HA pair, tried in order."""

    urls: list[Annotated[str, AfterValidator(_http_url)]] = Field(min_length=1)
    timeout: Duration = 5.0
    bearer_token_file: SecretFile | None = None


class DeadmanConfig(StrictModel):
    """The dead man's switch: the bot alerts through its own sinks when Alertmanager's always-firing Watchdog
    stops arriving (bot/deadman.py)."""

    enabled: bool = True
    alertname: str = Field(default="Watchdog", min_length=1)
    # Alertmanager's repeat_interval on the Watchdog's route (config/alertmanager.example.yml sets 1m).
    repeat_interval: Duration = Field(default=60.0, gt=0)
    # Silence longer than this raises WatchdogMissing; by default 3 x repeat_interval.
    timeout: Duration | None = None
    check_interval: Duration = Field(default=15.0, gt=0)
    # The Watchdog's labels that name its site (its Prometheus' external labels): each site's Watchdog is expected
    # on its own, and a silent site raises one WatchdogMissing naming it. A Watchdog with none of them has no site.
    site_labels: list[str] = Field(default_factory=lambda: ["site", "cluster"])

    @field_validator("site_labels")
    @classmethod
    def _label_names(cls, names: list[str]) -> list[str]:
        wrong = [name for name in names if not _LABEL_NAME.fullmatch(name)]
        if wrong:
            raise ValueError(f"not label names: {', '.join(wrong)}")
        return names

    @model_validator(mode="after")
    def _timeout_spans_a_repeat(self) -> DeadmanConfig:
        if self.timeout is not None and self.timeout <= self.repeat_interval:
            raise ValueError(
                "timeout must be longer than repeat_interval (3 x is the default): a Watchdog that is merely "
                "on time would raise WatchdogMissing"
            )
        return self

    @property
    def effective_timeout(self) -> float:
        return self.timeout if self.timeout is not None else 3 * self.repeat_interval

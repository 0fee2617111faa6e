"""SSH to a forced command: the account and key the bot logs in with, and the pinned host key."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from bot.config.base import ConfigPath, StrictModel
from bot.config.duration import Duration


class SshExecutorConfig(StrictModel):
    """SSH to a forced command (scripts/gpu-node-actions.sh): the bot sends only a fixed verb."""

    address: str = Field(min_length=1)
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(min_length=1)
    key_file: ConfigPath
    known_hosts: ConfigPath
    timeout: Duration = 120.0

    @field_validator("key_file", "known_hosts")
    @classmethod
    def _file_exists(cls, value: Path) -> Path:
        if not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

"""What the running bot tells of its configuration (its `GET /config`), so that `selftest --config FILE` can tell
whether the bot runs that file: its receivers' names and types, and a digest of its receivers and routing.

Never a secret: the receivers' names are on /metrics already, and the digest covers the receivers' and routing's
settings without the files they read (secrets, a CA file), whose paths differ on another host anyway.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from bot.config.root import BotConfig

CONFIG_PATH = "/config"


def described(config: BotConfig) -> dict[str, Any]:
    """The body of `GET /config`."""
    return {
        "receivers": [{"name": receiver.name, "type": receiver.type} for receiver in config.receivers],
        "digest": digest(config),
    }


def digest(config: BotConfig) -> str:
    """The same for two configurations whose receivers and routing say the same, whatever their comments, their
    other sections or where their files are."""
    settings = {
        "receivers": [receiver.model_dump(mode="json", by_alias=True) for receiver in config.receivers],
        "routing": config.routing.model_dump(mode="json", by_alias=True),
    }
    canonical = json.dumps(_without_files(settings), sort_keys=True, separators=(",", ":"))
    return f"sha256:{hashlib.sha256(canonical.encode()).hexdigest()}"


def _without_files(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_files(item) for key, item in value.items() if not key.endswith("_file")}
    if isinstance(value, list):
        return [_without_files(item) for item in value]
    return value

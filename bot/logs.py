"""Structured JSON logs on stderr (stdout belongs to the console sink), with every configured secret masked."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_MASK = "***"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the record's `extra` fields."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return self._mask(json.dumps(entry, default=str, ensure_ascii=False))

    def _mask(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _MASK)
            escaped = json.dumps(secret)[1:-1]
            if escaped != secret:
                text = text.replace(escaped, _MASK)
        return text


def configure_logging(level: str, secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # aiohttp's access log would duplicate the bot's own structured request logs.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # httpx logs every request at INFO: Loki and Prometheus queries would drown the bot's own lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)


class _Fields(logging.Filter):
    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__()
        self._fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self._fields.items():
            setattr(record, key, value)
        return True


def tag_records(**fields: str) -> None:
    """Add these fields to every line the bot logs: the replica's name, when several replicas share a store."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_Fields(fields))

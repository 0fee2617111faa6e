"""Structured JSON logs on stderr (stdout belongs to the console sink), with every configured secret masked."""

from __future__ import annotations

import json
import logging
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
_MASK = "***"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the record's `extra` fields."""

    def __init__(self, secrets: Callable[[], Iterable[str]] = tuple) -> None:
        super().__init__()
        # Asked for at each line: a secret file rewritten while the bot runs is masked from then on.
        self._secrets = secrets

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
        for secret in sorted({s for s in self._secrets() if len(s) >= 4}, key=len, reverse=True):
            text = text.replace(secret, _MASK)
            escaped = json.dumps(secret)[1:-1]
            if escaped != secret:
                text = text.replace(escaped, _MASK)
        return text


class RateLimitedLog:
    """At most one line per key every `interval` seconds: a flood of identical failures (a client retrying,
    a full disk, a full file table) stays visible without filling the disk. The lines left out meanwhile are
    counted and reported as `suppressed` on the key's next line."""

    def __init__(
        self, logger: logging.Logger, interval: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}

    def log(self, level: int, key: str, msg: str, *args: object, **fields: object) -> bool:
        """Log `msg` unless `key` was logged within the interval; whether it was logged."""
        suppressed = self.due(key)
        if suppressed is None:
            return False
        self._logger.log(level, msg, *args, extra={**fields, "suppressed": suppressed})
        return True

    def due(self, key: str) -> int | None:
        """None if `key` was logged within the interval (counted as suppressed); else how many were suppressed since
        its last line, for a caller that logs the line itself."""
        now = self._clock()
        previous = self._last.get(key)
        if previous is not None and now - previous[0] < self._interval:
            self._last[key] = (previous[0], previous[1] + 1)
            return None
        self._last[key] = (now, 0)
        return previous[1] if previous is not None else 0


class RepeatFilter(logging.Filter):
    """For a library's logger that says the same thing at every retry (psycopg's pool, once per reconnect attempt
    while PostgreSQL is away): one line per message template every `interval` seconds, the lines left out counted
    as `suppressed` on the next. The template, not the text: the text names a port or an object address."""

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        previous = self._last.get(key)
        if previous is not None and now - previous[0] < self._interval:
            self._last[key] = (previous[0], previous[1] + 1)
            return False
        self._last[key] = (now, 0)
        record.suppressed = previous[1] if previous is not None else 0
        return True


# Loggers of libraries that repeat one failure many times a second during an outage of what they reach.
_REPEATING_LOGGERS = ("psycopg.pool", "psycopg")


def configure_logging(level: str, secrets: Callable[[], Iterable[str]] = tuple) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(secrets))
    _quiet_repeating_libraries()
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # A library's warnings would be raw text on stderr between the JSON lines: they become lines of the
    # `py.warnings` logger. asyncssh's, as it loads, that cryptography deprecates DSA keys, say nothing an operator
    # can act on (five lines at each start): left out.
    warnings.filterwarnings("ignore", message="DSA is deprecated", module="asyncssh")
    logging.captureWarnings(True)
    # aiohttp's access log would duplicate the bot's own structured request logs.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # httpx logs every request at INFO: Loki and Prometheus queries would drown the bot's own lines.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _quiet_repeating_libraries() -> None:
    for name in _REPEATING_LOGGERS:
        library = logging.getLogger(name)
        for old in [f for f in library.filters if isinstance(f, RepeatFilter)]:
            library.removeFilter(old)
        library.addFilter(RepeatFilter())


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

"""Slack request signatures, checked on the raw body before anything is parsed.

slack_sdk's SignatureVerifier does the HMAC and the 5-minute window; it raises on a non-numeric timestamp, so
the headers are checked first. A valid request seen before within the window is a replay and is refused: the
signatures of the last 5 minutes are remembered (in memory: a restart forgets them, and Slack's own retries
carry a new timestamp, hence a new signature).
"""

from __future__ import annotations

from collections.abc import Mapping

from slack_sdk.signature import Clock as SlackSdkClock
from slack_sdk.signature import SignatureVerifier

from bot.clock import Clock

REPLAY_WINDOW = 300.0
_MAX_TIMESTAMP_DIGITS = 12
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
SIGNATURE_HEADER = "X-Slack-Signature"


class _SdkClock(SlackSdkClock):
    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now().timestamp()


class RequestVerifier:
    def __init__(self, signing_secret: str, clock: Clock) -> None:
        self._verifier = SignatureVerifier(signing_secret, clock=_SdkClock(clock))
        self._clock = clock
        self._seen: dict[str, float] = {}

    def problem(self, body: bytes, headers: Mapping[str, str]) -> str | None:
        """Why this request is not from Slack (or is a replay), or None when it is fine."""
        timestamp = headers.get(TIMESTAMP_HEADER, "")
        signature = headers.get(SIGNATURE_HEADER, "")
        if not timestamp or not signature:
            return f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header"
        if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= _MAX_TIMESTAMP_DIGITS):
            return f"malformed {TIMESTAMP_HEADER} header"
        now = self._clock.now().timestamp()
        if abs(now - int(timestamp)) > REPLAY_WINDOW:
            return "stale request: its timestamp is more than 5 minutes away"
        if not self._verifier.is_valid(body, timestamp, signature):
            return "bad signature"
        self._seen = {seen: at for seen, at in self._seen.items() if at >= now - REPLAY_WINDOW}
        if signature in self._seen:
            return "replayed request"
        self._seen[signature] = float(timestamp)
        return None

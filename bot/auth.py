"""Webhook authentication: a bearer token or HTTP basic credentials, compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from bot.config import WebhookAuthConfig


def _digest(text: str) -> bytes:
    # aiohttp decodes header bytes that are not UTF-8 with surrogateescape; keep them comparable, never raise.
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).digest()


def _same(presented: str, expected: str) -> bool:
    """Constant time, and comparing digests hides the expected length as well as its content."""
    return hmac.compare_digest(_digest(presented), _digest(expected))


class WebhookAuth:
    # The secrets are asked for at each request, so a rotated file is used without a restart.
    def __init__(self, config: WebhookAuthConfig) -> None:
        self._bearer = config.bearer_token_file
        self._basic = config.basic

    @property
    def enabled(self) -> bool:
        return self._bearer is not None or self._basic is not None

    @property
    def challenge(self) -> str:
        return 'Basic realm="gpu-alert-bot"' if self._basic and not self._bearer else 'Bearer realm="gpu-alert-bot"'

    def allows(self, authorization: str | None) -> bool:
        """Whether the Authorization header carries the configured credentials (always true when none are set)."""
        if not self.enabled:
            return True
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        credentials = credentials.strip()
        if scheme.lower() == "bearer" and self._bearer is not None:
            return _same(credentials, self._bearer.get())
        if scheme.lower() == "basic" and self._basic is not None:
            return self._basic_matches(credentials)
        return False

    def _basic_matches(self, credentials: str) -> bool:
        assert self._basic is not None
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            return False
        username, sep, password = decoded.partition(":")
        # Both comparisons always run, so the time taken does not tell which part was wrong.
        user_ok = _same(username, self._basic.username)
        password_ok = _same(password, self._basic.password_file.get())
        return bool(sep) and user_ok and password_ok

"""A library that says the same failure at every retry (psycopg's pool while PostgreSQL is away) is logged once a
minute per message template, with a count of the lines left out."""

from __future__ import annotations

import logging

import pytest

from bot.logs import RepeatFilter


def test_a_repeated_library_warning_is_one_line_a_minute_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    library = logging.getLogger("tests.repeating-library")
    library.addFilter(RepeatFilter(60.0, clock=lambda: now[0]))
    with caplog.at_level(logging.WARNING, logger=library.name):
        for port in range(40):  # the text changes (a port, an address); the template does not
            library.warning("error connecting in %r: %s", "pool", f"port {port} refused")
            now[0] += 1.0
        library.warning("discarding closed connection: %s", "<conn 1>")
        now[0] = 61.0
        library.warning("error connecting in %r: %s", "pool", "refused again")
    said = [(r.getMessage(), getattr(r, "suppressed", None)) for r in caplog.records]
    assert said == [
        ("error connecting in 'pool': port 0 refused", 0),
        ("discarding closed connection: <conn 1>", 0),
        ("error connecting in 'pool': refused again", 39),
    ]

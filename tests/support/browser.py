"""Debian's chromium (/usr/bin/chromium), driven headless by playwright through the system browser: no browser is
downloaded. One browser per test session (`browser` fixture, tests/conftest.py), a fresh context per page, each
watched for dialogs, console errors (a Content-Security-Policy refusal is one) and uncaught script errors: a page
that ran a script it should not have, or broke, says so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, async_playwright

CHROMIUM = Path("/usr/bin/chromium")


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    if not CHROMIUM.exists():
        raise RuntimeError("chromium is not installed (Debian package chromium); scripts/test installs it")
    async with async_playwright() as playwright:
        # --no-sandbox: the tests run as root in CI, where chromium's sandbox refuses to start.
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class Watched:
    page: Page
    dialogs: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    script_errors: list[str] = field(default_factory=list)

    @property
    def troubles(self) -> list[str]:
        return self.dialogs + self.console_errors + self.script_errors


@asynccontextmanager
async def watched_page(browser: Browser, **context: Any) -> AsyncIterator[Watched]:
    """A page of a context of its own (`context`: playwright's new_context options, e.g. http_credentials)."""
    opened = await browser.new_context(**context)
    page = await opened.new_page()
    watched = Watched(page)

    async def dialog(shown: Any) -> None:
        watched.dialogs.append(f"{shown.type}: {shown.message}")
        await shown.dismiss()

    page.on("dialog", dialog)
    page.on("console", lambda m: watched.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: watched.script_errors.append(str(error)))
    try:
        yield watched
    finally:
        await opened.close()

"""Who may read the pages behind an authenticating proxy: the oauth2-proxy example of docs/pages.md, tested. The bot
starts with the page's block, the proxy's block sends what the bot believes to where the bot serves the pages,
and chromium sending the proxy's header from its address reads them; the same header from an address that is not
the proxy's, or none, is refused. A bearer token of the pages' own opens them too; every answer carries the
security headers, refusals included."""

from __future__ import annotations

import asyncio
import re
import threading
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright.async_api import Browser, expect

from bot.pages.routes import PAGES_KEY, SECURITY_HEADERS
from bot.store.sqlite import SqliteStore
from tests.support.bot import running_bot
from tests.support.browser import watched_page
from tests.support.pages import GPUS, host_alerts, post, the_incident
from tests.support.payloads import gpu_alerts, webhook
from tests.support.processes import REPO, free_port

# In the session's event loop, the browser's.
in_browser_loop = pytest.mark.asyncio(loop_scope="session")


def documented(language: str) -> Any:
    """The code block of `language` in docs/pages.md's oauth2-proxy section."""
    section = (REPO / "docs" / "pages.md").read_text().split("## Behind oauth2-proxy", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(rf"```{language}\n(.*?)```", section, re.S)
    return yaml.safe_load(block) if language == "yaml" else tomllib.loads(block)


def bot_config(tmp_path: Path, proxies: list[str] | None = None) -> tuple[dict[str, Any], int]:
    """The documented bot block on a free port (and, given, other proxy addresses)."""
    config = documented("yaml")
    port = free_port()
    config["server"]["listen"] = f"127.0.0.1:{port}"
    if proxies is not None:
        config["server"]["pages"]["auth"]["proxy"]["proxies"] = proxies
    return config, port


def test_the_documented_proxy_sends_the_header_the_bot_believes_to_where_it_serves_the_pages() -> None:
    bot, proxy = documented("yaml")["server"], documented("toml")
    assert proxy["upstreams"] == [f"http://{bot['listen']}/pages/"]
    assert proxy["pass_user_headers"] is True  # X-Forwarded-User and X-Forwarded-Email
    assert bot["pages"]["auth"]["proxy"]["header"] == "X-Forwarded-Email"
    assert bot["pages"]["auth"]["proxy"]["proxies"] == ["127.0.0.1/32"]
    assert proxy["redirect_url"].startswith(bot["public_url"])


@in_browser_loop
async def test_the_proxys_header_from_its_address_opens_the_pages_and_from_elsewhere_nothing(
    tmp_path: Path, browser: Browser
) -> None:
    started = datetime.now(UTC).replace(microsecond=0)
    config, _ = bot_config(tmp_path)
    async with running_bot(tmp_path, config) as bot:
        for host in range(2):
            await post(bot, host_alerts(host, started))
        incident_id = await the_incident(bot.runtime.store, 2 * GPUS)
        page = f"{bot.url}/pages/incidents/{incident_id}"
        signed_in = {"X-Forwarded-Email": "alice@example.com"}
        async with watched_page(browser, extra_http_headers=signed_in) as watched:
            await watched.page.goto(page)
            await watched.page.wait_for_selector("body[data-ready='1']")
            await expect(watched.page.locator("#rows tr")).to_have_count(2 * GPUS)
            assert watched.troubles == []
        async with httpx.AsyncClient(base_url=bot.url) as client:
            for headers in ({}, {"X-Forwarded-Email": ""}, {"X-Forwarded-User": "alice"}):
                refused = await client.get(f"/pages/incidents/{incident_id}", headers=headers)
                assert refused.status_code == 401 and "k-ai-000" not in refused.text
                assert "WWW-Authenticate" not in refused.headers
                assert {name: refused.headers[name] for name in SECURITY_HEADERS} == SECURITY_HEADERS
    # The same header, from an address that is not the proxy's: refused.
    config, _ = bot_config(tmp_path, proxies=["192.0.2.10/32"])
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(base_url=bot.url) as client:
        refused = await client.get(f"/pages/incidents/{incident_id}", headers=signed_in)
        assert refused.status_code == 401 and "GPUTempCritical" not in refused.text


@in_browser_loop
async def test_a_bearer_token_of_the_pages_own_opens_them_and_every_answer_carries_the_security_headers(
    tmp_path: Path,
) -> None:
    token = tmp_path / "pages_token"
    token.write_text("pages-token-0123456789\n")
    token.chmod(0o600)
    config = {"server": {"pages": {"enabled": True, "auth": {"bearer_token_file": str(token)}}}}
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(base_url=bot.url) as client:
        good = {"Authorization": "Bearer pages-token-0123456789"}
        for path in ("/pages/incidents", "/pages/static/pages.js", "/pages/static/pages.css"):
            answer = await client.get(path, headers=good)
            assert answer.status_code == 200, path
            assert {name: answer.headers[name] for name in SECURITY_HEADERS} == SECURITY_HEADERS
        missing = await client.get("/pages/incidents/nope", headers=good)
        assert missing.status_code == 404 and "No incident by that name" in missing.text
        wrong = await client.get("/pages/incidents/nope/alerts?sort=bogus", headers=good)
        assert wrong.status_code == 400 and wrong.json()["message"].startswith("cannot sort by 'bogus'")
        assert (await client.get("/pages/incidents", headers={"Authorization": "Bearer nope"})).status_code == 401
        assert (await client.post("/pages/incidents", headers=good)).status_code == 405


@in_browser_loop
async def test_the_pages_read_a_store_of_their_own_so_a_busy_page_never_holds_up_a_webhook(tmp_path: Path) -> None:
    """The pages' SQLite reads run in a thread of their own: with that thread held (a page reading a huge incident,
    say), a webhook is still acknowledged, and the page answers once its thread is free."""
    token = tmp_path / "pages_token"
    token.write_text("pages-token-0123456789\n")
    config = {"server": {"pages": {"enabled": True, "auth": {"bearer_token_file": str(token)}}}}
    held = threading.Event()
    async with running_bot(tmp_path, config) as bot, httpx.AsyncClient(base_url=bot.url, timeout=30) as client:
        pages = bot.app[PAGES_KEY]
        assert isinstance(pages.store, SqliteStore) and pages.store is not bot.runtime.store
        busy = asyncio.ensure_future(pages.store._run(held.wait))
        page = asyncio.ensure_future(
            client.get("/pages/incidents", headers={"Authorization": "Bearer pages-token-0123456789"})
        )
        try:
            answer = await client.post("/alertmanager", json=webhook(gpu_alerts(3)))
            assert answer.status_code == 200
            assert not page.done()  # still waiting for its store
        finally:
            held.set()
        await busy
        assert (await page).status_code == 200

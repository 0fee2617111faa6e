"""The pages under /pages/, added to the bot's application when `server.pages.enabled` (docs/pages.md).

    GET /pages/incidents                      the incidents, the open ones first
    GET /pages/incidents/{id}                 an incident: what its card says, heat map, timeline, every alert
    GET /pages/incidents/{id}/summary         the same without the table (what an open page swaps in)
    GET /pages/incidents/{id}/alerts          one page of its alerts as JSON, sorted and filtered by the store
    GET /pages/incidents/{id}/version         what an open page polls to follow the incident
    GET /pages/incidents/{id}/heatmap.png     its alerts by host and start time
    GET /pages/alerts/{short_id}              an alert: its evidence, graph and history
    GET /pages/alerts/{short_id}/graph.png
    GET /pages/static/{pages.js,pages.css}

Read-only: no route changes anything. Every answer carries a strict Content-Security-Policy (the only script is
pages.js, served here; no inline script or style) and is never cached. The pages read the store through a
read-only store of their own, so their reads never wait behind (or hold up) a webhook's write.
"""

from __future__ import annotations

import collections
import importlib.resources
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bot.clock import Clock
from bot.config import BotConfig
from bot.incident.view import build_view
from bot.pages import queries
from bot.pages.alert import read_alert
from bot.pages.auth import PageAuth
from bot.pages.incident import heat_of, read_incident
from bot.pages.links import PAGES_PREFIX
from bot.pages.templates import render
from bot.render import incident_text
from bot.render.graph import render_alert_graph
from bot.render.graph_worker import GraphRenderer
from bot.render.incident_graph import render_incident_heat
from bot.store import Store, StoreUnavailable, open_store

log = logging.getLogger(__name__)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}
INCIDENTS_LISTED = 200
HOSTS_LISTED = 100
_STATIC = {"pages.js": "text/javascript", "pages.css": "text/css"}
# Pictures kept (by incident and version, or alert and last sighting): ten people on one incident draw it once.
_PICTURES = 16

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Pages:
    auth: PageAuth
    refresh: float
    clock: Clock
    store: Store | None = None
    renderer: GraphRenderer = field(default_factory=GraphRenderer)
    pictures: collections.OrderedDict[tuple[str, ...], bytes | None] = field(default_factory=collections.OrderedDict)

    @property
    def reader(self) -> Store:
        if self.store is None:
            raise StoreUnavailable("the pages' store is not open")
        return self.store

    async def picture(self, key: tuple[str, ...], draw: Callable[[], Awaitable[bytes | None]]) -> bytes | None:
        if key not in self.pictures:
            self.pictures[key] = await draw()
            while len(self.pictures) > _PICTURES:
                self.pictures.popitem(last=False)
        self.pictures.move_to_end(key)
        return self.pictures[key]


PAGES_KEY = web.AppKey("pages", Pages)


def add_pages(app: web.Application, config: BotConfig, clock: Clock) -> None:
    """Serve the pages under /pages/ from `app`, whose own store is open by the time the pages' opens."""
    pages = Pages(PageAuth(config.server.pages.auth), config.server.pages.refresh, clock)
    sub = web.Application(middlewares=[_guard])
    sub[PAGES_KEY] = app[PAGES_KEY] = pages

    async def lifecycle(_: web.Application) -> AsyncIterator[None]:
        # A read-only store of their own: two connections at most on PostgreSQL, a thread of its own on SQLite.
        pages.store = await open_store(config.store.model_copy(update={"pool_size": 2}), read_only=True, clock=clock)
        yield
        await pages.renderer.close()
        await pages.store.close()

    app.cleanup_ctx.append(lifecycle)
    sub.router.add_get("/incidents", _incidents)
    sub.router.add_get("/incidents/{id}", _incident)
    sub.router.add_get("/incidents/{id}/summary", _summary)
    sub.router.add_get("/incidents/{id}/alerts", _alerts)
    sub.router.add_get("/incidents/{id}/version", _version)
    sub.router.add_get("/incidents/{id}/heatmap.png", _heat_map)
    sub.router.add_get("/alerts/{short}", _alert)
    sub.router.add_get("/alerts/{short}/graph.png", _graph)
    sub.router.add_get("/static/{name}", _static)
    app.add_subapp(PAGES_PREFIX, sub)


# --- every answer: authenticated, with its security headers, errors as pages (or JSON for the script) ---------
@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    pages = request.app[PAGES_KEY]
    response: web.StreamResponse
    if pages.auth.reader(request) is None:
        response = _refused(request, 401, "Sign in", "These pages need a credential: nothing is shown without one.")
        if pages.auth.challenge:
            response.headers["WWW-Authenticate"] = pages.auth.challenge
    else:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _refused(request, exc.status, exc.reason, exc.text or exc.reason)
        except queries.BadQuery as exc:
            response = _refused(request, 400, "Bad request", str(exc))
        except StoreUnavailable:
            log.warning("the pages cannot read the store", exc_info=True)
            response = _refused(request, 503, "Store unavailable", "The store cannot be read now: try again shortly.")
    response.headers.update(SECURITY_HEADERS)
    return response


def _refused(request: web.Request, status: int, title: str, message: str) -> web.Response:
    if request.path.endswith(("/alerts", "/version")):
        return web.json_response({"error": title.lower().replace(" ", "_"), "message": message}, status=status)
    return _html("refused.html", status=status, title=title, message=message)


def _html(template: str, status: int = 200, **values: Any) -> web.Response:
    body = render(template, prefix=PAGES_PREFIX, **values)
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


def _not_found(what: str) -> web.HTTPNotFound:
    return web.HTTPNotFound(reason="Not found", text=f"No {what} by that name: it may have been pruned.")


# --- pages ------------------------------------------------------------------------------------------------------
async def _incidents(request: web.Request) -> web.Response:
    heads = await request.app[PAGES_KEY].reader.incident_heads(INCIDENTS_LISTED)
    return _html("incidents.html", heads=heads, limit=INCIDENTS_LISTED)


async def _incident(request: web.Request) -> web.Response:
    return _html("incident.html", **await _incident_values(request))


async def _summary(request: web.Request) -> web.Response:
    return _html("summary.html", **await _incident_values(request))


async def _incident_values(request: web.Request) -> dict[str, Any]:
    pages = request.app[PAGES_KEY]
    page = await read_incident(pages.reader, request.match_info["id"])
    if page is None:
        raise _not_found("incident")
    return {
        "view": page.view,
        "moments": page.moments,
        "text": incident_text,
        "first_action": incident_text.first_action(page.view),
        "base": f"{PAGES_PREFIX}/incidents/{_quoted(page.view.id)}",
        "stamp": queries.stamp(page.head),
        "refresh_ms": int(pages.refresh * 1000),
        "heat_map": pages.renderer.available,
        "host_limit": HOSTS_LISTED,
    }


async def _alerts(request: web.Request) -> web.Response:
    pages = request.app[PAGES_KEY]
    query = queries.alert_query(request.query)
    incident_id = request.match_info["id"]
    heads = await pages.reader.incident_heads(1, incident_id)
    if not heads:
        raise _not_found("incident")
    page = await pages.reader.incident_alert_page(incident_id, query)
    return web.json_response(queries.page_json(page, heads[0].alerts))


async def _version(request: web.Request) -> web.Response:
    heads = await request.app[PAGES_KEY].reader.incident_heads(1, request.match_info["id"])
    if not heads:
        raise _not_found("incident")
    return web.json_response(dict(queries.head_json(heads[0])))


async def _heat_map(request: web.Request) -> web.Response:
    pages = request.app[PAGES_KEY]
    record = await pages.reader.get_incident(request.match_info["id"])
    if record is None:
        raise _not_found("incident")

    async def draw() -> bytes | None:
        heat = await heat_of(pages.reader, record, build_view(record), pages.clock.now())
        return None if heat is None else await pages.renderer.render(render_incident_heat, heat)

    return _png(await pages.picture(("incident", record.id, str(record.version)), draw))


async def _alert(request: web.Request) -> web.Response:
    page = await read_alert(request.app[PAGES_KEY].reader, request.match_info["short"])
    if page is None:
        raise _not_found("alert")
    return _html(
        "alert.html",
        alert=page.alert,
        short=page.short,
        title=page.title,
        summary=page.summary,
        value_text=page.value_text,
        sections=page.sections,
        graph=page.graph_text if request.app[PAGES_KEY].renderer.available else "",
        events=page.events,
        incident_id=page.incident_id,
    )


async def _graph(request: web.Request) -> web.Response:
    pages = request.app[PAGES_KEY]
    page = await read_alert(pages.reader, request.match_info["short"])
    if page is None or page.graph is None:
        raise _not_found("graph")
    graph = page.graph

    async def draw() -> bytes | None:
        return await pages.renderer.render(render_alert_graph, graph)

    return _png(await pages.picture(("alert", page.alert.key, page.alert.last_seen.isoformat()), draw))


def _png(png: bytes | None) -> web.Response:
    if png is None:
        raise web.HTTPNotFound(reason="Not found", text="No picture: there is nothing to draw, or it failed.")
    return web.Response(body=png, content_type="image/png")


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _STATIC:
        raise _not_found("file")
    body = importlib.resources.files("bot.pages").joinpath("static", name).read_bytes()
    return web.Response(body=body, content_type=_STATIC[name], charset="utf-8")


def _quoted(text: str) -> str:
    return urllib.parse.quote(text, safe="")

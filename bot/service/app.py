"""The aiohttp application: routes, and the start-up and shut-down of the store, worker and outbox."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot.actions.admin import add_admin_routes
from bot.actions.build import RemediationService, build_remediation
from bot.auth import WebhookAuth
from bot.clock import SYSTEM_CLOCK, Clock
from bot.config import BotConfig, InteractivityConfig
from bot.config.digest import CONFIG_PATH, described
from bot.deadman import Deadman
from bot.ingest import WEBHOOK_PATH, WebhookHandler, json_error
from bot.metrics import Metrics
from bot.playbooks import PlaybookSet
from bot.server import request_deadlines
from bot.service.heartbeat import heartbeat_checks
from bot.service.readiness import StoreQuestions
from bot.store import Store, StoreUnavailable, open_store

if TYPE_CHECKING:
    from bot.enrich.base import EnrichmentRunner
    from bot.incident.stage import IncidentStage
    from bot.interact.service import Interactivity
    from bot.outbox import Outbox
    from bot.worker import Worker

log = logging.getLogger(__name__)


@dataclass
class Processing:
    """The worker side: dedup, pipeline and outbox, with the enrichers they use."""

    outbox: Outbox
    worker: Worker
    enrichers: EnrichmentRunner
    incidents: IncidentStage

    async def close(self) -> None:
        await self.worker.stop()
        await self.outbox.stop()
        await self.enrichers.close()
        await self.incidents.close()


@dataclass
class Runtime:
    """Everything that runs in the background of one bot process. `processing` is None in an ingest process,
    whose worker runs in another process (bot.service.roles)."""

    store: Store
    processing: Processing | None
    interactivity: Interactivity | None = None
    deadman: Deadman | None = None
    remediation: RemediationService | None = None

    def notify_worker(self) -> None:
        """New work is in the store. A worker in another process sees the store's commits by itself."""
        if self.processing is not None:
            self.processing.worker.notify()

    async def close(self) -> None:
        if self.remediation is not None:
            await self.remediation.stop()
        if self.deadman is not None:
            await self.deadman.stop()
        if self.interactivity is not None:
            await self.interactivity.close()
        if self.processing is not None:
            await self.processing.close()
        await self.store.close()


def start_processing(
    config: BotConfig,
    store: Store,
    metrics: Metrics,
    playbooks: PlaybookSet,
    console: TextIO | None,
    executable: frozenset[str],
    clock: Clock = SYSTEM_CLOCK,
) -> Processing:
    """Sinks, outbox, enrichers, pipeline and worker, started. `executable`: the remediation actions whose
    buttons the Slack messages show."""
    # Imported here: an ingest process (serve --role ingest) never builds the worker side, whose sinks,
    # enrichers and their clients (slack_sdk, httpx, aiosmtplib) would cost it tens of MB.
    from bot.enrich import build_enrichers
    from bot.incident.analyser import incident_analyser
    from bot.incident.stage import IncidentStage
    from bot.interact.service import slack_controls
    from bot.outbox import Outbox
    from bot.pages.links import page_links
    from bot.pipeline import Pipeline
    from bot.routing import Router
    from bot.sinks import build_sinks
    from bot.worker import Worker

    controls = slack_controls(config, executable)
    sinks = build_sinks(config.receivers, store, metrics, console, controls, clock, page_links(config.server))
    metrics.init_receivers(sinks)
    outbox = Outbox(store, sinks, config.outbox, metrics, receiver_lease=config.store.receiver_lease, clock=clock)
    enrichers = build_enrichers(config.enrichment, store, metrics, playbooks.xid_catalog, config.remediation)
    incidents = IncidentStage(store, config.incidents, playbooks, incident_analyser(config), metrics, clock)
    pipeline = Pipeline(
        store,
        enrichers,
        playbooks,
        Router(config.routing),
        outbox,
        metrics,
        incidents=incidents,
        late_copy_window=config.store.late_copy_window,
    )
    worker = Worker(pipeline, store, config.worker, config.store, metrics, clock)
    # Other replicas' work wakes this one at once (PostgreSQL LISTEN/NOTIFY); polling stays the fallback.
    store.subscribe(worker.notify, lambda receiver: outbox.wake([receiver]))
    outbox.start()
    worker.start()
    return Processing(outbox=outbox, worker=worker, enrichers=enrichers, incidents=incidents)


async def start_runtime(
    config: BotConfig,
    metrics: Metrics,
    playbooks: PlaybookSet,
    console: TextIO | None = None,
    clock: Clock = SYSTEM_CLOCK,
    side: Literal["all", "ingest"] = "all",
) -> Runtime:
    """`side` "all" runs the worker and outbox in this process too; "ingest" leaves them to a worker process."""
    store = await open_store(config.store, side=side, clock=clock)
    interactivity = _interactivity(config, store)
    runtime = Runtime(store=store, processing=None, interactivity=interactivity)
    # Built before the sinks, which show a button only for an action the engine can run.
    remediation = (
        _remediation_service(config, store, runtime.notify_worker, metrics, playbooks, interactivity)
        if config.remediation.hosts
        else None
    )
    if side == "all":
        runtime.processing = start_processing(
            config, store, metrics, playbooks, console, executable_actions(remediation), clock
        )
    if interactivity is not None:
        await interactivity.start()
    if config.deadman.enabled:
        runtime.deadman = Deadman(store, config.deadman, metrics, clock, runtime.notify_worker, config.alertmanager)
        runtime.deadman.start()
    if remediation is not None:
        await remediation.start()
        runtime.remediation = remediation
    return runtime


def executable_actions(remediation: RemediationService | None) -> frozenset[str]:
    return frozenset(remediation.engine.executable_actions()) if remediation is not None else frozenset()


def _interactive(section: InteractivityConfig | None) -> bool:
    return section is not None and section.enabled


def _interactivity(config: BotConfig, store: Store) -> Interactivity | None:
    if not _interactive(config.interactivity):
        return None
    # Imported here: slack_sdk and the Slack commands cost tens of MB to a bot without interactivity.
    from bot.interact.service import Interactivity

    return Interactivity(config, store)


def _remediation_service(
    config: BotConfig,
    store: Store,
    notify: Callable[[], None],
    metrics: Metrics,
    playbooks: PlaybookSet,
    interactivity: Interactivity | None,
) -> RemediationService:
    """The remediation engine, answering Slack's commands and buttons when interactivity is on."""
    if interactivity is None:
        return build_remediation(config, store, notify, metrics, playbooks)
    # Imported here like the Interactivity they extend (_interactivity).
    from bot.interact.approval import approval_messages, incident_thread_notes
    from bot.interact.fleet import FleetCommands
    from bot.interact.remediation import RemediationCommands, SlackAuthorizer

    access = interactivity.access
    remediation = build_remediation(
        config,
        store,
        notify,
        metrics,
        playbooks,
        # Approvals by Slack users are judged by their Slack role; the CLI's by `remediation.approvers`.
        authorizer=lambda configured: SlackAuthorizer(access, configured),
        announcer=incident_thread_notes(config, interactivity, store),
    )
    RemediationCommands(remediation.engine, access).register(interactivity.dispatcher)
    FleetCommands(remediation.fleet, access).register(interactivity.dispatcher)
    interactivity.commands.add_status(remediation.status)
    remediation.engine.watch_approvals(approval_messages(config, interactivity, store))
    return remediation


RUNTIME_KEY = web.AppKey("runtime", Runtime)
METRICS_KEY = web.AppKey("metrics", Metrics)
WEBHOOK_KEY = web.AppKey("webhook", WebhookHandler)
STORE_INFO_KEY = web.AppKey("store_info", dict[str, str])
CLOCK_KEY = web.AppKey("clock", Clock)
READY_TIMEOUT_KEY = web.AppKey("ready_timeout", float)
READY_QUESTIONS_KEY = web.AppKey("ready_questions", StoreQuestions)
CONFIG_KEY = web.AppKey("config", dict[str, Any])
WORKER_PROCESS_KEY: web.AppKey[Callable[[], str | None]] = web.AppKey("worker_process")


def build_app(
    config: BotConfig,
    playbooks: PlaybookSet,
    metrics: Metrics | None = None,
    console: TextIO | None = None,
    clock: Clock = SYSTEM_CLOCK,
    side: Literal["all", "ingest"] = "all",
    worker_process: Callable[[], str | None] | None = None,
) -> web.Application:
    """The bot as an aiohttp application. `console` is where console sinks write (default: stdout); `clock`
    drives the dead man's switch; `side` "ingest" leaves the worker and outbox to a worker process (bot.service.roles),
    whose heartbeat /readyz then reads, and `worker_process` (its supervisor's) says why it is not running."""
    metrics = metrics or Metrics()
    app = web.Application(client_max_size=config.server.max_body_bytes, middlewares=[request_deadlines, _json_errors])
    app[METRICS_KEY] = metrics
    app[STORE_INFO_KEY] = {"backend": config.store.backend, "replica": config.store.replica}
    app[CLOCK_KEY] = clock
    app[CONFIG_KEY] = described(config)
    app[WORKER_PROCESS_KEY] = worker_process or _runs_in_this_process
    app[READY_TIMEOUT_KEY] = config.server.ready_timeout
    app[READY_QUESTIONS_KEY] = questions = StoreQuestions()
    metrics.replica_info.labels(config.store.replica, config.store.backend).set(1)
    auth = WebhookAuth(config.server.auth)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        runtime = await start_runtime(config, metrics, playbooks, console, clock, side)
        app[RUNTIME_KEY] = runtime
        app[WEBHOOK_KEY] = WebhookHandler(
            runtime.store,
            auth,
            config.server,
            metrics,
            runtime.notify_worker,
            runtime.deadman.observe if runtime.deadman is not None else None,
        )
        yield
        await questions.close()
        await runtime.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post(WEBHOOK_PATH, _webhook)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get(CONFIG_PATH, _config)
    if _interactive(config.interactivity):
        # Imported here like the Interactivity it serves (_interactivity).
        from bot.interact.service import add_http_routes

        add_http_routes(app, config.interactivity, lambda request: request.app[RUNTIME_KEY].interactivity)
    admin_token = config.remediation.admin_token_file
    add_admin_routes(app, admin_token.get() if admin_token else None, _remediation)
    if config.server.pages.enabled:
        # Imported here: a bot without pages loads no template engine.
        from bot.pages.routes import add_pages

        add_pages(app, config, clock)
    return app


def _remediation(request: web.Request) -> RemediationService | None:
    return request.app[RUNTIME_KEY].remediation


async def _webhook(request: web.Request) -> web.Response:
    return await request.app[WEBHOOK_KEY](request)


async def _config(request: web.Request) -> web.Response:
    """Which receivers the bot runs with, and a digest of its receivers and routing: what `selftest` compares."""
    return web.json_response(request.app[CONFIG_KEY])


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "alive"})


async def _readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME_KEY]
    budget = request.app[READY_TIMEOUT_KEY]
    questions = request.app[READY_QUESTIONS_KEY]
    # One deadline for every store answer, asked at once: a store that hangs costs `budget`, not a sum of waits.
    deadline = asyncio.get_running_loop().time() + budget
    checks: dict[str, str] = {}
    if runtime.processing is not None:
        checks["store"] = await _store_check(questions, runtime.store, deadline, budget)
        checks["worker"] = "running" if runtime.processing.worker.running else "stopped"
        checks["outbox"] = "running" if runtime.processing.outbox.running else "stopped"
    else:
        replica, clock = request.app[STORE_INFO_KEY]["replica"], request.app[CLOCK_KEY]
        store, beats = await asyncio.gather(
            _store_check(questions, runtime.store, deadline, budget),
            _worker_process_checks(questions, runtime.store, replica, clock, deadline, budget),
        )
        checks["store"] = store
        checks |= beats
        # A heartbeat written just before the worker process died is still recent: the supervisor knows better.
        down = request.app[WORKER_PROCESS_KEY]()
        if down is not None:
            checks["worker"] = down
    if runtime.deadman is not None:
        checks["deadman"] = runtime.deadman.readiness
    ready = checks["store"] == "writable" and checks["worker"] == "running" and checks["outbox"] == "running"
    body = {"status": "ready" if ready else "not ready", "checks": checks}
    body |= {"store": request.app[STORE_INFO_KEY]}
    return web.json_response(body, status=200 if ready else 503)


async def _store_check(questions: StoreQuestions, store: Store, deadline: float, budget: float) -> str:
    try:
        await questions.answer("writable", store.check_writable, deadline)
        return "writable"
    except TimeoutError:
        return f"not writable: no answer within {budget:g} s (server.ready_timeout)"
    except StoreUnavailable as exc:
        return f"not writable: {exc}" if str(exc) else "not writable"


async def _worker_process_checks(
    questions: StoreQuestions, store: Store, replica: str, clock: Clock, deadline: float, budget: float
) -> dict[str, str]:
    try:
        return await questions.answer("heartbeat", lambda: heartbeat_checks(store, replica, clock.now()), deadline)
    except TimeoutError:
        unknown = f"unknown: the store did not answer within {budget:g} s"
        return {"worker": unknown, "outbox": unknown}
    except StoreUnavailable:
        return {"worker": "unknown: the store cannot be read", "outbox": "unknown: the store cannot be read"}


def _runs_in_this_process() -> str | None:
    return None


def build_metrics_app(metrics: Metrics) -> web.Application:
    """/metrics alone: what a worker process serves, on `worker.metrics_listen`."""
    app = web.Application()
    app[METRICS_KEY] = metrics
    app.router.add_get("/metrics", _metrics)
    return app


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (404, 405, 413) as JSON like ours, a POST to an unknown path counted and logged like
    a refused webhook; an unexpected exception as a JSON 500, logged."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404 and request.method == "POST" and WEBHOOK_KEY in request.app:
            # Alertmanager posting to the wrong path (its url without /alertmanager) must not fail silently.
            return request.app[WEBHOOK_KEY].wrong_path(request)
        response = json_error(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or exc.reason)
        for name in ("Allow", "WWW-Authenticate"):
            if name in exc.headers:
                response.headers[name] = exc.headers[name]
        return response
    except Exception:
        log.exception("unexpected error while handling a request", extra={"path": request.path})
        request.app[METRICS_KEY].error("internal")
        return json_error(500, "internal_error", "unexpected error; see the bot's log")

"""The HTTP server's defences against hostile or broken clients (docs/hardening.md).

aiohttp answers what its HTTP parser rejects (a TLS hello, a duplicate Content-Length, a header over 8 KB...)
itself, through `RequestHandler.handle_error`, before any middleware runs: as text/plain, logging the parser's
exception with a traceback whose text quotes the offending bytes, credentials included. The bot serves its
application through a `RequestHandler` subclass that answers those with JSON like every other refusal and logs
one rate-limited line naming the kind of error only. The same handler bounds how long a client may take to send
its headers, how long a connection may stay idle, and how many connections are open at once; the body's own
deadline is the webhook handler's (bot/ingest.py), which answers 503 so that Alertmanager retries.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import http_exceptions, web
from aiohttp.web_request import BaseRequest

from bot.config import ServerConfig
from bot.ingest import json_error
from bot.logs import RateLimitedLog

log = logging.getLogger(__name__)

_LINGERING_TIME = 1.0
_ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# What each parser error means, in words that quote nothing the client sent: the parser's own message carries
# the raw bytes around the error, which may be someone's credentials.
_PARSER_PROBLEMS: tuple[tuple[type[http_exceptions.HttpProcessingError], str, str], ...] = (
    (http_exceptions.BadStatusLine, "bad_request_line", "not an HTTP/1.x request (TLS sent to an http:// port?)"),
    (http_exceptions.LineTooLong, "header_too_large", "the request line or a header is too long"),
    (http_exceptions.InvalidHeader, "invalid_header", "a header is malformed"),
    (http_exceptions.ContentLengthError, "invalid_content_length", "the Content-Length is invalid"),
    (http_exceptions.TransferEncodingError, "invalid_transfer_encoding", "the Transfer-Encoding is invalid"),
    (http_exceptions.InvalidURLError, "invalid_url", "the request target is not a valid URL"),
)


def parser_problem(exc: http_exceptions.HttpProcessingError) -> tuple[str, str]:
    """A stable code and a description of what the parser refused; never the parser's message."""
    for kind, code, description in _PARSER_PROBLEMS:
        if isinstance(exc, kind):
            return code, description
    return "bad_request", "malformed HTTP request (invalid headers, framing or encoding)"


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's protocol with JSON parser errors, no quoted bytes in the log, a header deadline and a cap on
    the number of open connections."""

    def __init__(
        self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, config: ServerConfig, logs: RateLimitedLog
    ) -> None:
        super().__init__(
            manager,
            loop=loop,
            keepalive_timeout=config.idle_timeout,
            # After a refusal with the body unread, how long aiohttp drains it before closing (default 10 s).
            lingering_time=_LINGERING_TIME,
            access_log=None,  # type: ignore[arg-type]  # aiohttp's documented way to turn it off
            # Alertmanager never compresses: nothing is decompressed, so no gzip bomb can inflate in memory.
            auto_decompress=False,
        )
        self._connections = manager
        self._event_loop = loop
        self._config = config
        self._logs = logs
        self._headers_timer: asyncio.TimerHandle | None = None
        self._handling = False
        self._idle_since = loop.time()

    # --- connections ---
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_headers_timer()
        if len(self._connections.connections) > self._config.max_connections:
            # Evicting the longest-idle connection keeps the bot reachable when idle or slow clients hold
            # every slot; only when all are busy is the newcomer the one refused.
            idle = [c for c in self._guarded_connections() if c is not self and c.open and not c._handling]
            victim = min(idle, key=lambda c: c._idle_since) if idle else self
            self._logs.log(
                logging.WARNING,
                "max_connections",
                "connection limit reached: closed the longest-idle connection"
                if idle
                else "connection limit reached: every connection is busy, refused a new one",
                max_connections=self._config.max_connections,
            )
            victim.force_close()

    @property
    def open(self) -> bool:
        """Not closed nor closing (a connection evicted a moment ago leaves the list only when its handler ends)."""
        return self.transport is not None

    def _guarded_connections(self) -> list[GuardedRequestHandler]:
        return [c for c in self._connections.connections if isinstance(c, GuardedRequestHandler)]

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_headers_timer()
        super().connection_lost(exc)

    # --- the header deadline ---
    def data_received(self, data: bytes) -> None:
        # Bytes outside a request being handled are a new request's headers: they must be complete in time
        # (as must the first request's, counted from the connection's opening).
        if not self._handling and data:
            self._start_headers_timer()
        super().data_received(data)

    def _start_headers_timer(self) -> None:
        if self._headers_timer is None:
            self._headers_timer = self._event_loop.call_later(self._config.header_timeout, self._headers_too_slow)

    def request_started(self) -> None:
        self._handling = True
        self._stop_headers_timer()

    def request_finished(self) -> None:
        self._handling = False
        self._idle_since = self._event_loop.time()

    def _headers_too_slow(self) -> None:
        self._headers_timer = None
        if not self._handling:
            self._logs.log(
                logging.INFO,
                "header_timeout",
                "closed a connection whose request headers did not arrive in time",
                header_timeout=self._config.header_timeout,
            )
            self.force_close()

    def _stop_headers_timer(self) -> None:
        if self._headers_timer is not None:
            self._headers_timer.cancel()
            self._headers_timer = None

    # --- errors ---
    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the response had started; the connection is closed instead")
        if isinstance(exc, http_exceptions.HttpProcessingError):
            error, description = parser_problem(exc)
        else:  # aiohttp's own answer to an exception or a timeout the application did not catch
            error, description = "internal_error", "unexpected error; see the bot's log"
        self._logs.log(
            logging.WARNING,
            f"http_{status}_{error}",
            "refused a malformed HTTP request: %s (HTTP %d)" if status < 500 else "HTTP request failed: %s (HTTP %d)",
            error,
            status,
            peer=request.remote,
            status=status,
            reason=error,
        )
        response = json_error(status, error, description)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp's own failures outside the application: the kind only, no traceback that could quote bytes.
        failure = kw.get("exc_info")
        kind = type(failure).__name__ if isinstance(failure, BaseException) else "unknown"
        self._logs.log(logging.ERROR, f"protocol_{kind}", "HTTP protocol error: %s", kind, error_type=kind)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_deadlines(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Tell the connection a request is being handled, so its header deadline does not cut the body short."""
    protocol = request.protocol
    if not isinstance(protocol, GuardedRequestHandler):
        return await handler(request)
    protocol.request_started()
    try:
        return await handler(request)
    finally:
        protocol.request_finished()


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are served by `GuardedRequestHandler`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, config: ServerConfig) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._config = config
        self._logs = RateLimitedLog(log)

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        install_accept_error_log(loop, self._logs)
        self._server = await loop.create_server(self._protocol, self._host, self._port, reuse_address=True)

    def _protocol(self) -> GuardedRequestHandler:
        manager = self._runner.server
        assert manager is not None, "the runner is set up before its site starts"
        return GuardedRequestHandler(manager, loop=asyncio.get_running_loop(), config=self._config, logs=self._logs)


def install_accept_error_log(loop: asyncio.AbstractEventLoop, logs: RateLimitedLog) -> None:
    """asyncio reports each failed accept() (out of file descriptors...) to the loop's exception handler, which
    logs it with a traceback: thousands of lines a minute while the table is full. Keep one a minute."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        failure = context.get("exception")
        if isinstance(failure, OSError) and failure.errno in _ACCEPT_ERRNOS:
            logs.log(
                logging.ERROR,
                f"accept_{failure.errno}",
                "cannot accept connections: %s",
                failure.strerror or str(failure),
                errno=errno.errorcode.get(failure.errno or 0, "unknown"),
            )
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)

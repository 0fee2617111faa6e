"""What failed, in words a person reads: a failed call said as what happened ("could not resolve the host name",
"connection refused", "no answer in time"), never as the class name of the library that raised it
(`ClientConnectorDNSError`, `ConnectError`). The libraries wrap the operating system's error, so its cause is
looked for along the exception's chain."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import aiohttp
import httpx

_CLOSED = (httpx.RemoteProtocolError, aiohttp.ServerDisconnectedError, ConnectionResetError, BrokenPipeError)
_TIMEOUTS = (TimeoutError, httpx.TimeoutException, aiohttp.ServerTimeoutError)


def what_failed(exc: BaseException) -> str:
    """The failure said as what happened; an error of no known kind says its own message."""
    causes = list(_chain(exc))
    for say in (_name_or_connection, _tls, _time_or_close, _system):
        said = next((words for cause in causes if (words := say(cause))), "")
        if said:
            return said
    return str(exc).strip() or "failed without saying why"


def _name_or_connection(exc: BaseException) -> str:
    if isinstance(exc, socket.gaierror):
        return f"could not resolve the host name ({exc.strerror or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    return ""


def _tls(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the server's TLS certificate was not accepted: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError):
        return f"the TLS handshake failed: {exc.reason or exc}"
    return ""


def _time_or_close(exc: BaseException) -> str:
    if isinstance(exc, _TIMEOUTS):
        return "no answer in time"
    if isinstance(exc, _CLOSED):
        return "the connection was closed before an answer"
    return ""


def _system(exc: BaseException) -> str:
    """Any other error of the operating system, in its own words ("no route to host")."""
    if isinstance(exc, OSError) and isinstance(exc.strerror, str) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return ""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception, then what caused it, innermost last, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__

"""A loopback fake of the Docker Engine API on a unix socket (or TCP with mutual TLS), speaking what moby
documents (protocols.md 8.1).

`GET /_ping` (`OK`, header `Api-Version`), `GET /version` (`ApiVersion`, `MinAPIVersion`), versioned paths
`/v1.NN/...` (a version below the minimum: 400 with Docker's message), `GET /containers/{name}/json`, and
`POST /containers/{name}/restart?t=N`, which blocks for `restart_seconds` as a real stop and start does and
answers 204 with no body; an unknown container: 404 `{"message": "No such container: <name>"}`; a container set
to fail: 500 `{"message": ...}`. Every request is recorded as (method, path, query).
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from pathlib import Path
from typing import Self

from aiohttp import web

API_VERSION = "1.47"
MIN_API_VERSION = "1.24"
_VERSIONED = re.compile(r"^/v(?P<version>\d+\.\d+)/")


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


class FakeDocker:
    def __init__(self, socket_path: Path, containers: list[str], tls: ssl.SSLContext | None = None) -> None:
        """On the unix socket `socket_path`; with `tls`, on a loopback TCP port with that server context instead
        (dockerd's `--tlsverify`: the context asks for a client certificate)."""
        self.socket_path = socket_path
        self.tls = tls
        self.port = 0
        self.containers = {name: {"restarts": 0} for name in containers}
        self.failing: set[str] = set()
        self.restart_seconds = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}" if self.tls else f"unix://{self.socket_path}"

    def restarts(self, name: str) -> int:
        return self.containers[name]["restarts"]

    async def start(self) -> Self:
        app = web.Application(middlewares=[self._record_and_route_version])
        for prefix in ("", "/v{version:[0-9]+\\.[0-9]+}"):
            app.router.add_get(prefix + "/_ping", self._ping)
            app.router.add_get(prefix + "/version", self._version)
            app.router.add_get(prefix + "/containers/{name}/json", self._inspect)
            app.router.add_post(prefix + "/containers/{name}/restart", self._restart)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        if self.tls is None:
            await web.UnixSite(self._runner, str(self.socket_path)).start()
        else:
            await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls).start()
            self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    @web.middleware
    async def _record_and_route_version(self, request: web.Request, handler: web.RequestHandler) -> web.StreamResponse:
        self.requests.append((request.method, request.path, dict(request.query)))
        match = _VERSIONED.match(request.path)
        if match is None:
            return await handler(request)
        if _version_tuple(match["version"]) < _version_tuple(MIN_API_VERSION):
            return _error(
                400,
                f"client version {match['version']} is too old. Minimum supported API version is {MIN_API_VERSION}, "
                "please upgrade your client to a newer version",
            )
        if _version_tuple(match["version"]) > _version_tuple(API_VERSION):
            return _error(
                400, f"client version {match['version']} is too new. Maximum supported API version is {API_VERSION}"
            )
        return await handler(request)

    async def _ping(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", headers={"Api-Version": API_VERSION, "Docker-Experimental": "false"})

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"Version": "27.5.1", "ApiVersion": API_VERSION, "MinAPIVersion": MIN_API_VERSION})

    async def _inspect(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.containers:
            return _error(404, f"No such container: {name}")
        return web.json_response({"Id": f"{name}-id", "Name": f"/{name}", "State": {"Status": "running"}})

    async def _restart(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.containers:
            return _error(404, f"No such container: {name}")
        await asyncio.sleep(self.restart_seconds)  # a restart answers once the container is stopped and started
        if name in self.failing:
            return _error(500, f"Cannot restart container {name}: OCI runtime start failed: no GPU device found")
        self.containers[name]["restarts"] += 1
        return web.Response(status=204)


def _error(status: int, message: str) -> web.Response:
    # dockerd's exact Content-Type, without a charset (clients compare it as a whole).
    body = json.dumps({"message": message}).encode()
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json"})

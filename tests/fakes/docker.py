"""A loopback fake of the Docker Engine API on a unix socket (or TCP with mutual TLS), speaking what moby
documents (protocols.md 8.1).

`GET /_ping` (`OK`, header `Api-Version`), `GET /version` (`ApiVersion`, `MinAPIVersion`), versioned paths
`/v1.NN/...` (a version below the minimum: 400 with Docker's message), `GET /containers/json` (the running
containers, every one with `all=1`: `Id`, `Names` with their leading slash, `Image`, `State`, `Status`, and of
`HostConfig` only `NetworkMode`, as dockerd lists them), `GET /containers/{id or name}/json` (the inspect answer:
`Name`, `State.Running`, `State.StartedAt`, `Config.Image`, `Config.Env`, `HostConfig.Runtime` and
`HostConfig.DeviceRequests`), and `POST /containers/{name}/restart?t=N`, which blocks for `restart_seconds` as a
real stop and start does and answers 204 with no body; an unknown container: 404 `{"message": "No such container:
<name>"}`; a container set to fail: 500 `{"message": ...}`; `failing_list` makes the listing answer 500,
`failing_inspect` and `gone` make a listed container's inspect answer 500 or 404 (removed in between). Every
request is recorded as (method, path, query).

A container holds GPUs as dockerd records them: `gpu_request(...)` is the DeviceRequest of `docker run --gpus`
(`Count` -1 for all, or `DeviceIDs`), and `NVIDIA_VISIBLE_DEVICES` in `env` counts under the nvidia runtime.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from aiohttp import web

API_VERSION = "1.47"
MIN_API_VERSION = "1.24"
_VERSIONED = re.compile(r"^/v(?P<version>\d+\.\d+)/")


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def gpu_request(
    device_ids: list[str] | None = None, count: int = 0, driver: str = "", capabilities: list[list[str]] | None = None
) -> dict[str, Any]:
    """A DeviceRequest as dockerd stores it: `docker run --gpus all` is Count -1 with no Driver and the `gpu`
    capability; `--gpus '"device=2,3"'` names DeviceIDs; compose's reservations set Driver `nvidia`."""
    return {
        "Driver": driver,
        "Count": count,
        "DeviceIDs": device_ids,
        "Capabilities": capabilities if capabilities is not None else [["gpu"]],
        "Options": {},
    }


@dataclass
class FakeContainer:
    name: str
    image: str = "busybox:1.36"
    device_requests: list[dict[str, Any]] | None = None
    env: list[str] = field(default_factory=list)
    runtime: str = "runc"
    started_at: str = "2026-12-01T22:13:05.123456789Z"
    running: bool = True
    restarts: int = 0

    @property
    def id(self) -> str:
        return hashlib.sha256(self.name.encode()).hexdigest()

    def listed(self) -> dict[str, Any]:
        return {
            "Id": self.id,
            "Names": [f"/{self.name}"],
            "Image": self.image,
            "ImageID": "sha256:" + hashlib.sha256(self.image.encode()).hexdigest(),
            "Command": "/bin/sh",
            "Created": 1796163185,
            "State": "running" if self.running else "exited",
            "Status": "Up 2 hours" if self.running else "Exited (0) 1 hour ago",
            "Labels": {},
            "HostConfig": {"NetworkMode": "default"},
        }

    def inspected(self) -> dict[str, Any]:
        return {
            "Id": self.id,
            "Name": f"/{self.name}",
            "Image": "sha256:" + hashlib.sha256(self.image.encode()).hexdigest(),
            "State": {
                "Status": "running" if self.running else "exited",
                "Running": self.running,
                "StartedAt": self.started_at,
            },
            "Config": {"Image": self.image, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", *self.env], "Labels": {}},
            "HostConfig": {"Runtime": self.runtime, "DeviceRequests": self.device_requests, "NetworkMode": "default"},
        }


class FakeDocker:
    def __init__(self, socket_path: Path, containers: list[str], tls: ssl.SSLContext | None = None) -> None:
        """On the unix socket `socket_path`; with `tls`, on a loopback TCP port with that server context instead
        (dockerd's `--tlsverify`: the context asks for a client certificate)."""
        self.socket_path = socket_path
        self.tls = tls
        self.port = 0
        self.containers = {name: FakeContainer(name) for name in containers}
        self.failing: set[str] = set()
        self.failing_list: str | None = None
        self.failing_inspect: set[str] = set()
        self.gone: set[str] = set()
        self.restart_seconds = 0.0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}" if self.tls else f"unix://{self.socket_path}"

    def restarts(self, name: str) -> int:
        return self.containers[name].restarts

    def run(self, name: str, **settings: Any) -> FakeContainer:
        """A container started with these settings (FakeContainer's fields)."""
        container = self.containers[name] = FakeContainer(name, **settings)
        return container

    def _find(self, name_or_id: str) -> FakeContainer | None:
        if name_or_id in self.containers:
            return self.containers[name_or_id]
        return next((c for c in self.containers.values() if c.id == name_or_id), None)

    async def start(self) -> Self:
        app = web.Application(middlewares=[self._record_and_route_version])
        for prefix in ("", "/v{version:[0-9]+\\.[0-9]+}"):
            app.router.add_get(prefix + "/_ping", self._ping)
            app.router.add_get(prefix + "/version", self._version)
            app.router.add_get(prefix + "/containers/json", self._list)
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

    async def _list(self, request: web.Request) -> web.Response:
        if self.failing_list is not None:
            return _error(500, self.failing_list)
        every = request.query.get("all", "") in ("1", "true", "True")
        return web.json_response([c.listed() for c in self.containers.values() if c.running or every])

    async def _inspect(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        container = self._find(name)
        if container is None or container.name in self.gone:
            return _error(404, f"No such container: {name}")
        if container.name in self.failing_inspect:
            return _error(500, f"open /var/lib/docker/containers/{container.id}/config.v2.json: input/output error")
        return web.json_response(container.inspected())

    async def _restart(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.containers:
            return _error(404, f"No such container: {name}")
        await asyncio.sleep(self.restart_seconds)  # a restart answers once the container is stopped and started
        if name in self.failing:
            return _error(500, f"Cannot restart container {name}: OCI runtime start failed: no GPU device found")
        self.containers[name].restarts += 1
        return web.Response(status=204)


def _error(status: int, message: str) -> web.Response:
    # dockerd's exact Content-Type, without a charset (clients compare it as a whole).
    body = json.dumps({"message": message}).encode()
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json"})

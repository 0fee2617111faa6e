"""What every loopback fake shares: an aiohttp app on 127.0.0.1 that can go down and come back on its port."""

from __future__ import annotations

from typing import Self

from aiohttp import web


class LoopbackServer:
    """Subclasses build their app in `routes`. `go_down` refuses connections (as a dead service does) and
    `come_back` listens again on the same port, so clients configured with the URL reach it again."""

    port: int = 0
    shutdown_timeout: float = 60.0
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    def application(self) -> web.Application:
        return web.Application()

    async def start(self) -> Self:
        app = self.application()
        self.routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout)
        await self._runner.setup()
        await self._listen()
        return self

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        self.port = self._runner.addresses[-1][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._site = None

    async def go_down(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def come_back(self) -> None:
        if self._site is None:
            await self._listen()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

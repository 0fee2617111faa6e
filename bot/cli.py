"""Command line: `gpu-alert-bot serve | check-config` (and `python -m bot`)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.app import WEBHOOK_PATH, build_app
from bot.config import BotConfig, ConfigError, load_config
from bot.logs import configure_logging
from bot.playbooks import PlaybookError, PlaybookSet

log = logging.getLogger("bot")

EXIT_OK = 0
EXIT_CONFIG = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-alert-bot",
        description="Alertmanager receiver for GPU servers: durable, deduplicated, enriched notifications.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the webhook receiver, worker and outbox")
    serve.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="override server.listen")
    serve.add_argument("--store", metavar="PATH", type=Path, help="override store.path (SQLite file)")
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check-config", help="validate a configuration file and its playbooks")
    check.add_argument("config", type=Path)
    check.set_defaults(run=_check_config)
    return parser


def _load(path: Path | None, overrides: dict[str, Any] | None = None) -> tuple[BotConfig, PlaybookSet]:
    config = load_config(path, overrides)
    playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)
    return config, playbooks


def _print_problems(problems: Sequence[str]) -> None:
    for problem in problems:
        print(problem, file=sys.stderr)


def _check_config(args: argparse.Namespace) -> int:
    try:
        _load(args.config)
    except (ConfigError, PlaybookError) as exc:
        _print_problems(exc.problems)
        print(f"{args.config}: {len(exc.problems)} problem(s)", file=sys.stderr)
        return EXIT_CONFIG
    print(f"{args.config}: OK")
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    overrides: dict[str, Any] = {}
    if args.listen:
        overrides["server.listen"] = args.listen
    if args.store:
        overrides["store.path"] = str(args.store.resolve())
    try:
        config, playbooks = _load(args.config, overrides)
    except (ConfigError, PlaybookError) as exc:
        _print_problems(exc.problems)
        return EXIT_CONFIG
    configure_logging(config.logging.level, config.secrets())
    try:
        asyncio.run(_run_server(config, playbooks))
    except OSError as exc:
        log.error("cannot start", extra={"reason": str(exc)})
        return 1
    return EXIT_OK


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_host(config: BotConfig) -> str:
    """Without webhook credentials anyone who can reach the port could inject alerts: stay on loopback."""
    host = config.server.host
    if config.server.auth.enabled or _is_loopback(host):
        return host
    return "127.0.0.1"


async def _run_server(config: BotConfig, playbooks: PlaybookSet) -> None:
    host = listen_host(config)
    if not config.server.auth.enabled:
        log.warning(
            "no webhook credentials configured: listening on loopback only; "
            "set server.auth (bearer_token_file or basic) to accept a remote Alertmanager",
            extra={"requested": config.server.host, "listening": host},
        )
    runner = web.AppRunner(build_app(config, playbooks), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, config.server.port, shutdown_timeout=5)
    await site.start()
    log.info(
        "gpu-alert-bot ready",
        extra={
            "listen": f"{host}:{config.server.port}",
            "webhook": WEBHOOK_PATH,
            "store": str(config.store.path),
            "auth": "on" if config.server.auth.enabled else "off",
            "receivers": [r.name for r in config.receivers],
        },
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await runner.cleanup()

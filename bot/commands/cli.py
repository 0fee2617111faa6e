"""Command line: `gpu-alert-bot serve | check-config | explain | xid | gpus | report | incidents | audit |
healthcheck | selftest | run | approve | refuse | reset-breaker | migrate | store copy` (and `python -m bot`).

Each command's own modules are imported by its handler (`_xid`, `_gpus`...), not here: every process of `serve`
imports this module, and would otherwise keep the enrichers, sinks and self-test of the other commands in memory."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.commands.store_reading import no_store_here
from bot.config import (
    BotConfig,
    ConfigError,
    listen_address,
    load_config,
    located,
    parse_duration,
    role_warnings,
    secret_file_warnings,
)
from bot.logs import configure_logging, tag_records
from bot.playbooks import PlaybookError, PlaybookSet
from bot.service.roles import ROLES, CannotStart, listen_host, serve_ingest, serve_worker, worker_command
from bot.service.supervisor import CANNOT_START, PARENT_PIPE_OPTION
from bot.store import StoreUnavailable

log = logging.getLogger("bot")

EXIT_OK = 0
EXIT_START = 1
EXIT_CONFIG = CANNOT_START  # a worker process exiting with it is not restarted
# What a shell reports for a command killed by SIGPIPE (cat, grep...): `| head` read what it wanted and left,
# the output was cut short. Quiet, like them, yet not a success for a `set -o pipefail` script to build on.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.run(args)
        sys.stdout.flush()  # here, so a reader gone before the last write is caught too
    except BrokenPipeError:
        # Python's advice (library/signal, "Note on SIGPIPE"): point stdout at /dev/null, so the interpreter's
        # own flush at exit does not fail again with "Exception ignored ... BrokenPipeError".
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu-alert-bot",
        description="Alertmanager receiver for GPU servers: durable, deduplicated, enriched notifications.",
    )
    version = importlib.metadata.version("gpu-alert-bot")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the webhook receiver, worker and outbox")
    serve.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    serve.add_argument("--listen", metavar="HOST:PORT", type=_listen, help="override server.listen")
    serve.add_argument(
        "--worker-metrics-listen", metavar="HOST:PORT", type=_listen, help="override worker.metrics_listen"
    )
    _store_option(serve)
    serve.add_argument(
        "--role",
        choices=ROLES,
        default="all",
        help="all: the webhook receiver, supervising a worker process (default); ingest or worker: one side only",
    )
    serve.add_argument(PARENT_PIPE_OPTION, type=int, help=argparse.SUPPRESS)  # set by `--role all` for its worker
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check-config", help="validate a configuration file and its playbooks")
    check.add_argument("config", type=Path, help="the YAML configuration file to check")
    check.set_defaults(run=_check_config)

    explain = commands.add_parser(
        "explain", help="show how a webhook payload would be routed and rendered, sending nothing"
    )
    what = explain.add_mutually_exclusive_group(required=True)
    what.add_argument("payload", nargs="?", type=Path, help="Alertmanager webhook body (JSON file; - reads stdin)")
    what.add_argument("--alert", metavar="ID", help="an alert the bot stored: its short id (as in its message) or key")
    explain.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    explain.add_argument("--enrich", action="store_true", help="run the configured enrichers (read-only)")
    explain.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    explain.add_argument(
        "--graph", type=Path, metavar="OUT.png", help="write the picture of each alert's history (needs --enrich)"
    )
    explain.add_argument("--graph-theme", choices=("light", "dark"), default="light", help="the picture's theme")
    explain.set_defaults(run=_explain)

    xid = commands.add_parser(
        "xid", help="decode NVIDIA Xid errors in kernel log text, e.g. journalctl -k | gpu-alert-bot xid"
    )
    xid.add_argument("file", nargs="?", type=Path, help="kernel log file (default: standard input)")
    xid.add_argument("--format", choices=("json", "table"), help="events: JSON lines (default) or a table")
    xid.add_argument("--explain", metavar="CODE", type=int, help="print the catalog entry of one Xid code")
    xid.add_argument("--catalog", type=Path, help="Xid catalog file (default: the bundled playbooks/xid_catalog.yaml)")
    xid.set_defaults(run=_xid)

    gpus = commands.add_parser("gpus", help="list each GPU's Xid and alert history from the bot's store")
    gpus.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    gpus.add_argument("--since", type=_duration, default="30d", help="how far back, e.g. 24h or 30d (default 30d)")
    gpus.add_argument("--format", choices=("table", "json"), default="table", help="a table (default) or JSON lines")
    _store_option(gpus)
    gpus.set_defaults(run=_gpus)

    report = commands.add_parser("report", help="write an incident's timeline as Markdown, its heat map beside it")
    report.add_argument("incident", help="the incident's id, as its card or console line shows it")
    report.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    report.add_argument("--out", type=Path, help="the Markdown file (default: incident-ID.md here)")
    _store_option(report)
    report.set_defaults(run=_report)
    incidents = commands.add_parser("incidents", help="list the incidents in the store: open first, then recent")
    incidents.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    _store_option(incidents)
    incidents.set_defaults(run=_report, incident=None, out=None)  # a report of no incident lists them

    migrate = commands.add_parser("migrate", help="bring the store's schema to this version (serve does it too)")
    migrate.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    migrate.set_defaults(run=_migrate)

    store = commands.add_parser("store", help="store maintenance")
    store_commands = store.add_subparsers(dest="store_command", required=True, metavar="STORE_COMMAND")
    store_copy = store_commands.add_parser(
        "copy", help="copy alert history, conversations, GPU history and audit log into another store"
    )
    store_copy.add_argument(
        "--from", dest="from_config", type=Path, required=True, metavar="CONFIG_A", help="the old store's config"
    )
    store_copy.add_argument(
        "--to", dest="to_config", type=Path, required=True, metavar="CONFIG_B", help="configuration of the new store"
    )
    store_copy.set_defaults(run=_store_copy)

    audit = commands.add_parser("audit", help="print the audit log: who asked the bot to do what, and the outcome")
    audit.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    audit.add_argument("--since", type=_duration, default="24h", help="how far back, e.g. 1h or 7d (default 24h)")
    audit.add_argument("--format", choices=("table", "json"), default="table", help="a table (default) or JSON lines")
    _store_option(audit)
    audit.set_defaults(run=_audit)

    health = commands.add_parser(
        "healthcheck", help="exit 0 when the bot serving this configuration answers /healthz (container probes)"
    )
    health.add_argument(
        "--ready", action="store_true", help="ask /readyz instead: the store takes writes, the worker and outbox run"
    )
    health.add_argument("--config", type=Path, help="YAML configuration file (default: built-in defaults)")
    health.add_argument("--timeout", type=_duration, default="4s", help="how long to wait for the answer (default 4s)")
    health.set_defaults(run=_healthcheck)

    selftest = commands.add_parser(
        "selftest", help="prove the alert path: dependencies, Alertmanager routing, a synthetic alert to each receiver"
    )
    selftest.add_argument("--config", type=Path, help="the running bot's YAML configuration file")
    selftest.add_argument("--alertmanager", metavar="URL", help="Alertmanager to test (default: alertmanager.urls)")
    selftest.add_argument("--receiver", metavar="NAME", help="Alertmanager receiver that must get the alert")
    selftest.add_argument("--bot", metavar="URL", help="the bot's URL as Alertmanager's webhook_configs name it")
    selftest.add_argument("--timeout", type=_duration, default="5m", help="longest wait for the alert (default 5m)")
    selftest.add_argument("--pagerduty-event", action="store_true", help="also send the test alert to PagerDuty")
    selftest.add_argument("--json", action="store_true", help="the result as JSON on stdout (progress on stderr)")
    selftest.set_defaults(run=_selftest)

    run = commands.add_parser("run", help="ask the running bot to run a remediation action on an alert's host")
    run.add_argument("action", help="an action of the registry, e.g. restart-dcgm-exporter")
    run.add_argument("--alert", required=True, help="the alert's short id (as in its message), key or fingerprint")
    run.add_argument("--dry-run", action="store_true", help="only say what would be done")
    _admin_options(run)
    run.set_defaults(
        run=_ask_bot, verb="run", payload=lambda a: {"action": a.action, "alert": a.alert, "dry_run": a.dry_run}
    )
    for verb in ("approve", "refuse"):
        decide = commands.add_parser(verb, help=f"{verb} a remediation run waiting for approval")
        decide.add_argument("run_id", type=int, metavar="RUN", help="the run number the request printed")
        _admin_options(decide)
        decide.set_defaults(run=_ask_bot, verb=verb, payload=lambda a: {"run": a.run_id})
    reset = commands.add_parser("reset-breaker", help="close the remediation circuit breaker (admins)")
    _admin_options(reset)
    reset.set_defaults(run=_ask_bot, verb="reset-breaker", payload=lambda a: {})
    return parser


def _store_option(command: argparse.ArgumentParser) -> None:
    command.add_argument("--store", metavar="PATH", type=Path, help="override store.path (SQLite file)")


def _store_override(args: argparse.Namespace) -> dict[str, Any]:
    return {"store.path": str(args.store.resolve())} if args.store else {}


def _admin_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="the bot's YAML configuration (admin token, listen address)")
    parser.add_argument("--url", help="the bot's address (default: from server.listen, on loopback)")


def _ask_bot(args: argparse.Namespace) -> int:
    """`run`, `approve`, `refuse`, `reset-breaker`: the running bot's admin endpoint, `args.verb` with the request
    `args.payload(args)` makes from the options."""
    config = _load_or_report(args.config)
    if config is None:
        return EXIT_CONFIG
    from bot.actions.cli import remediation_command

    return remediation_command(config, args.verb, args.payload(args), args.url)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen(text: str) -> str:
    """Checked here so that the problem names the option the user typed, not the configuration key."""
    try:
        return listen_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _load(path: Path | None, overrides: dict[str, Any] | None = None) -> tuple[BotConfig, PlaybookSet]:
    config = load_config(path, overrides)
    playbooks = PlaybookSet.load(config.playbooks.dir, config.playbooks.vars)
    return config, playbooks


def _load_or_report(path: Path | None, overrides: dict[str, Any] | None = None) -> BotConfig | None:
    """The configuration, or None once its problems are printed (the command then exits with EXIT_CONFIG)."""
    try:
        return load_config(path, overrides)
    except ConfigError as exc:
        _print_problems(exc.problems)
        return None


def _print_problems(problems: Sequence[str]) -> None:
    for problem in problems:
        print(located(problem), file=sys.stderr)


def _check_config(args: argparse.Namespace) -> int:
    try:
        config, _playbooks = _load(args.config)
    except (ConfigError, PlaybookError) as exc:
        _print_problems(exc.problems)
        print(f"{args.config}: {len(exc.problems)} problem(s)", file=sys.stderr)
        return EXIT_CONFIG
    _print_problems([f"warning: {warning}" for warning in [*secret_file_warnings(config), *role_warnings(config)]])
    print(f"{args.config}: OK")
    return EXIT_OK


def _explain(args: argparse.Namespace) -> int:
    try:
        config, playbooks = _load(args.config)
    except (ConfigError, PlaybookError) as exc:
        _print_problems(exc.problems)
        return EXIT_CONFIG
    from bot.commands.explain import run as run_explain

    return run_explain(
        args.payload or args.alert,
        config,
        playbooks,
        enrich=args.enrich,
        output=args.format,
        graph=args.graph,
        theme=args.graph_theme,
    )


def _xid(args: argparse.Namespace) -> int:
    from bot.commands.xid import xid_command

    return xid_command(args.file, args.format, args.explain, args.catalog)


def _gpus(args: argparse.Namespace) -> int:
    config = _load_or_report(args.config, _store_override(args))
    if config is None or no_store_here(config, named=bool(args.config or args.store)):
        return EXIT_CONFIG
    from bot.commands.gpus import gpus_command

    return asyncio.run(gpus_command(config, args.since, args.format))


def _report(args: argparse.Namespace) -> int:
    config = _load_or_report(args.config, _store_override(args))
    if config is None:
        return EXIT_CONFIG
    from bot.commands.report import report_command

    return asyncio.run(report_command(config, args.incident, args.out))


def _audit(args: argparse.Namespace) -> int:
    config = _load_or_report(args.config, _store_override(args))
    if config is None or no_store_here(config, named=bool(args.config or args.store)):
        return EXIT_CONFIG
    from bot.audit import audit_command

    return asyncio.run(audit_command(config, args.since, args.format))


def _selftest(args: argparse.Namespace) -> int:
    config = _load_or_report(args.config)
    if config is None:
        return EXIT_CONFIG
    from bot.selftest.command import Options as SelftestOptions
    from bot.selftest.command import selftest_command

    options = SelftestOptions(
        alertmanager=args.alertmanager,
        receiver=args.receiver,
        timeout=args.timeout,
        bot_url=args.bot,
        config_file=str(args.config) if args.config else None,
        pagerduty_event=args.pagerduty_event,
        output="json" if args.json else "table",
    )
    return asyncio.run(selftest_command(config, options))


def _migrate(args: argparse.Namespace) -> int:
    from bot.store.copy import migrate_command

    return asyncio.run(migrate_command(args.config))


def _store_copy(args: argparse.Namespace) -> int:
    from bot.store.copy import store_copy_command

    return asyncio.run(store_copy_command(args.from_config, args.to_config))


def _serve(args: argparse.Namespace) -> int:
    overrides = _store_override(args)
    if args.listen:
        overrides["server.listen"] = args.listen
    if args.worker_metrics_listen:
        overrides["worker.metrics_listen"] = args.worker_metrics_listen
    try:
        config, playbooks = _load(args.config, overrides)
    except (ConfigError, PlaybookError) as exc:
        _print_problems(exc.problems)
        return EXIT_CONFIG
    configure_logging(config.logging.level, config.secrets)
    if config.store.backend == "postgresql":
        tag_records(replica=config.store.replica)
    for warning in [*secret_file_warnings(config), *role_warnings(config)]:
        log.warning(warning)
    if args.role != "all":
        tag_records(role=args.role)
    try:
        if args.role == "worker":
            asyncio.run(serve_worker(config, playbooks, args.parent_pipe))
        else:
            worker = worker_command(_serve_options(args)) if args.role == "all" else None
            asyncio.run(serve_ingest(config, playbooks, worker))
    except CannotStart as exc:
        log.error("cannot start", extra={"reason": str(exc)})
        return EXIT_CONFIG
    except (OSError, StoreUnavailable) as exc:
        log.error("cannot start", extra={"reason": str(exc)})
        return EXIT_START
    return EXIT_OK


def _serve_options(args: argparse.Namespace) -> list[str]:
    """This `serve`'s options, for the worker process of `--role all` (paths absolute: same files)."""
    options = ["--config", str(args.config.resolve())] if args.config else []
    options += ["--listen", args.listen] if args.listen else []
    options += ["--worker-metrics-listen", args.worker_metrics_listen] if args.worker_metrics_listen else []
    return options + (["--store", str(args.store.resolve())] if args.store else [])


def _healthcheck(args: argparse.Namespace) -> int:
    config = _load_or_report(args.config)
    if config is None:
        return EXIT_CONFIG
    from bot.commands.healthcheck import ALIVE_PATH, READY_PATH, probe

    path = READY_PATH if args.ready else ALIVE_PATH
    return EXIT_OK if probe(listen_host(config), config.server.port, args.timeout, path) else EXIT_START

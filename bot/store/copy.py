"""`gpu-alert-bot store copy` and `gpu-alert-bot migrate`: moving up from SQLite, and schema upgrades.

A site that outgrows one machine keeps its recurrence ledger: the alert records (with acks and silences), the
conversations (so a resolve still updates the Slack message posted before the move), the GPU history, the audit
log, the dead man's switch timers and the remediation runs and breaker move to the new store through the Store
interface, from any backend to any other (core.COPIED_TABLES).
"""

from __future__ import annotations

import sys
from pathlib import Path

from bot.config import ConfigError, StoreConfig, load_config
from bot.storage.interface import SchemaChange, Store, StoreUnavailable
from bot.store import open_store
from bot.store.core import COPIED_TABLES

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2


async def copy_store(source: Store, destination: Store) -> dict[str, int]:
    """Rows inserted per table. Rows the destination already has are kept as they are, so a copy interrupted
    half-way can be run again (the audit log has no key: its rows are compared whole)."""
    copied: dict[str, int] = {}
    for table in COPIED_TABLES:
        present = {tuple(row.values()) for row in await destination.export_rows(table)}
        rows = [row for row in await source.export_rows(table) if tuple(row.values()) not in present]
        copied[table] = await destination.import_rows(table, rows) if rows else 0
    return copied


def _store_config(path: Path) -> StoreConfig | None:
    try:
        return load_config(path).store
    except ConfigError as exc:
        print("\n".join(f"{path}: {problem}" for problem in exc.problems), file=sys.stderr)
        return None


def _describe(config: StoreConfig) -> str:
    return str(config.path) if config.backend == "sqlite" else f"postgresql (replica {config.replica})"


async def store_copy_command(from_config: Path, to_config: Path) -> int:
    source_config, destination_config = _store_config(from_config), _store_config(to_config)
    if source_config is None or destination_config is None:
        return EXIT_CONFIG
    if source_config == destination_config:
        print("--from and --to name the same store", file=sys.stderr)
        return EXIT_CONFIG
    try:
        source = await open_store(source_config, read_only=True)
    except StoreUnavailable as exc:
        print(f"cannot open the source store {_describe(source_config)}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    running = await source.running_bots()
    if running:
        print(
            f"warning: a bot still uses the source store {_describe(source_config)} ({', '.join(running)}): what it "
            "records while the copy runs may be left behind; stop it, then run the copy again (copied rows are kept)",
            file=sys.stderr,
        )
    try:
        destination = await open_store(destination_config)
    except StoreUnavailable as exc:
        await source.close()
        print(f"cannot open the destination store {_describe(destination_config)}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        copied = await copy_store(source, destination)
    except StoreUnavailable as exc:
        print(f"copy interrupted (run it again; copied rows are kept): {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        await destination.close()
        await source.close()
    for table, rows in copied.items():
        print(f"{table}: {rows} rows copied")
    return EXIT_OK


async def migrate_command(config_path: Path | None) -> int:
    """Opening a store applies its migrations (or refuses a schema newer than this version knows)."""
    config = StoreConfig() if config_path is None else _store_config(config_path)
    if config is None:
        return EXIT_CONFIG
    try:
        store = await open_store(config)
    except StoreUnavailable as exc:
        print(f"cannot migrate the store {_describe(config)}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    await store.close()
    print(f"the store {_describe(config)}: {_schema_text(store.schema)}")
    return EXIT_OK


def _schema_text(schema: SchemaChange) -> str:
    if schema.found == 0:
        return f"no schema yet (a new store): created it at schema version {schema.now}"
    if schema.found == schema.now:
        return f"found schema version {schema.found}, this version's: nothing to do"
    return f"found schema version {schema.found}: migrated it to version {schema.now}"

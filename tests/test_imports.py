"""The import graph of bot/: no cycle anywhere, the playbook model stays light to import, and a process of `serve`
loads only what its role and its configuration use."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import httpx
import pytest

import bot
from tests.support.payloads import am_alert, body, webhook
from tests.support.processes import REPO, ManagedProcess, free_port, wait_http

PACKAGE = Path(bot.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module under bot/ by dotted name; a package is its __init__.py."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(name: str, path: Path) -> Iterator[str]:
    """What a module imports, wherever the statement stands: a function-local or TYPE_CHECKING import hides a
    cycle, it does not remove it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield from (f"{base}.{alias.name}" for alias in node.names)
            yield base


def dependencies(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of bot/ that importing `name` runs: each imported module and those of its packages that
    are not already being imported as packages of `name` itself."""
    own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    found = set()
    for imported in imported_names(name, path):
        parts = imported.split(".")
        for i in range(1, len(parts) + 1):
            target = ".".join(parts[:i])
            if target in modules and target not in own_packages and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: dependencies(name, path, set(files)) for name, path in files.items()}


def test_bot_has_no_import_cycle() -> None:
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


# The rooms that wire the bot together or run one of its jobs (the store's backends, the self-test, remediation, Slack
# commands, the service, the command line, the worker's loop), and the layers below them that they build on: the
# stages of the alert path and what those know (the models, the configuration, the playbooks, the Store interface,
# the self-test label, the action catalog). A lower module never imports a higher room: docs/architecture.md.
HIGHER = (
    "bot.store",
    "bot.selftest",
    "bot.actions",
    "bot.interact",
    "bot.service",
    "bot.commands",
    "bot.server",
    "bot.worker",
    "bot.outbox",
    "bot.pipeline",
    "bot.ingest",
)
LOWER = (
    "bot.models",
    "bot.message",
    "bot.config",
    "bot.playbooks",
    "bot.storage",
    "bot.selftest_label",
    "bot.action_catalog",
    "bot.dedup",
    "bot.routing",
    "bot.evidence",
    "bot.gpu",
    "bot.slurm",
    "bot.enrich",
    "bot.incident",
    "bot.compose",
    "bot.render",
    "bot.sinks",
)


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(package + ".") for package in packages)


def test_the_layers_read_one_way() -> None:
    upward = sorted(
        f"{module} -> {imported}"
        for module, imported_modules in import_graph().items()
        if _in(module, LOWER)
        for imported in imported_modules
        if _in(imported, HIGHER)
    )
    assert upward == []


def test_the_walk_sees_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    first = tmp_path / "first.py"
    first.write_text("def later() -> None:\n    from bot.second import x\n", encoding="utf-8")
    second = tmp_path / "second.py"
    second.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import bot.first\n", encoding="utf-8")
    modules = {"bot.first", "bot.second"}
    graph = {"bot.first": dependencies("bot.first", first, modules)}
    graph["bot.second"] = dependencies("bot.second", second, modules)
    with pytest.raises(CycleError):
        TopologicalSorter(graph).prepare()


def test_a_package_importing_its_own_modules_is_no_cycle() -> None:
    graph = import_graph()
    assert "bot.enrich.xid" in graph["bot.enrich"]
    assert "bot.enrich" not in graph["bot.enrich.xid"]


def loaded_by(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stdout))


@pytest.mark.parametrize("module", ["bot.playbooks", "bot.evidence", "bot.verdict"])
def test_the_playbook_model_and_evidence_load_no_enricher_http_client_or_store(module: str) -> None:
    loaded = loaded_by(module)
    heavy = {name for name in loaded if name == "httpx" or name.startswith(("bot.store", "bot.enrich"))}
    assert heavy == set()


# Runs `serve` as the command line does and writes, as the process exits, every module it had loaded.
_SERVE_AND_LIST_MODULES = """
import atexit, json, sys
from pathlib import Path
from bot.commands.cli import main
atexit.register(lambda: Path(sys.argv[1]).write_text(json.dumps(sorted(sys.modules))))
sys.exit(main(sys.argv[2:]))
"""
_WORKER_ONLY = ("psycopg", "slack_sdk", "aiosmtplib", "bot.store.postgresql", "bot.enrich", "bot.sinks", "bot.outbox")


def test_an_ingest_process_with_the_example_config_loads_no_postgresql_enricher_or_sink(tmp_path: Path) -> None:
    modules = tmp_path / "modules.json"
    port = free_port()
    serve = ["serve", "--role", "ingest", "--config", str(REPO / "config" / "bot.example.yaml")]
    serve += ["--store", str(tmp_path / "bot.db"), "--listen", f"127.0.0.1:{port}"]
    ingest = ManagedProcess([sys.executable, "-c", _SERVE_AND_LIST_MODULES, str(modules), *serve], cwd=tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", timeout=60, process=ingest.process)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/alertmanager",
            content=body(webhook([am_alert(host="k-ai-01", gpu="3")])),
            headers={"Content-Type": "application/json"},
        )
        assert answer.json()["status"] == "accepted"
    finally:
        assert ingest.stop() == 0
    loaded = json.loads(modules.read_text())
    assert "bot.ingest" in loaded
    assert [name for name in loaded if any(_within(name, package) for package in _WORKER_ONLY)] == []


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")

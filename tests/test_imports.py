"""The import graph of bot/: no cycle anywhere, and the playbook model stays light to import."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

import bot

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

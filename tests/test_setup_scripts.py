"""scripts/run installs what the bot needs to run, not the test tools, and says what it installs before pip's
quiet minute; scripts/setup test adds the test tools. Run on a copy of the scripts and pyproject.toml whose
.venv's python and gpu-alert-bot only record how they were called (pip itself would need the network and a
minute per case)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO

RECORDER = '#!/usr/bin/env bash\necho "$(basename "$0") $*" >> "$(dirname "$0")/../calls"\n'


def _checkout(tmp_path: Path) -> Path:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for script in ("run", "setup"):
        shutil.copy2(REPO / "scripts" / script, checkout / "scripts" / script)
    shutil.copy2(REPO / "pyproject.toml", checkout / "pyproject.toml")
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "gpu-alert-bot"):
        (bin_dir / tool).write_text(RECORDER)
        (bin_dir / tool).chmod(0o755)
    return checkout


def _run(checkout: Path, *command: str) -> tuple[list[str], str]:
    """The calls the .venv's tools received, and what the script said on standard error."""
    done = subprocess.run(
        [str(checkout / command[0]), *command[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": sys.executable},
        check=True,
    )
    calls = checkout / ".venv" / "calls"
    return (calls.read_text().splitlines() if calls.exists() else []), done.stderr


def test_scripts_run_installs_the_runtime_only_and_says_what_before_it_installs(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    calls, said = _run(checkout, "scripts/run", "--listen", "127.0.0.1:9095")
    assert calls == [
        "python -m pip install --quiet --upgrade pip",
        "python -m pip install --quiet -e .",
        "gpu-alert-bot serve --config config/bot.example.yaml --listen 127.0.0.1:9095",
    ]
    first, *_ = said.splitlines()
    assert first.startswith("setup: installing gpu-alert-bot into .venv with what it needs to run: aiohttp, pydantic")
    assert "pytest" not in said and "mypy" not in said


def test_scripts_setup_test_adds_the_test_tools_which_scripts_run_then_uses_as_they_are(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path)
    calls, said = _run(checkout, "scripts/setup", "test")
    assert calls[-1] == "python -m pip install --quiet -e .[test]"
    assert "with its test tools: " in said and "pytest" in said and "mypy" in said
    (checkout / ".venv" / "calls").unlink()
    calls, said = _run(checkout, "scripts/run")
    assert calls == ["gpu-alert-bot serve --config config/bot.example.yaml"]
    assert said == ""

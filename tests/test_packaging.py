"""The bot as a user installs it: a wheel built from the sources the Dockerfile copies, installed (not editable)
into a fresh venv, run from a directory that is not the checkout. Its playbooks and Xid catalog come from the
wheel or nowhere."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.support.processes import REPO, ManagedProcess, free_port, wait_http

pytestmark = pytest.mark.wheel

# What the Dockerfile's wheel stage copies: the wheel must need nothing else.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "bot", "playbooks", "config/rules")
XID_79_LINE = "Nov 30 10:00:00 gpu1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off."


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    elsewhere: Path

    def command(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.venv / "bin" / "gpu-alert-bot"), *args],
            cwd=self.elsewhere,
            env=_clean_env(),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )


def _clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(*args: str | Path, cwd: Path) -> None:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, source / name)
    # Offline: the test venv's setuptools builds it, as the build-system table asks.
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", work / "dist", ".", cwd=source
    )
    wheel = next((work / "dist").glob("gpu_alert_bot-*.whl"))
    venv = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work)
    # The dependencies come from the test venv's site-packages, named by a plain path line: the .pth files in it
    # (the editable install's hook onto the checkout) are not run, so `bot` can only be the wheel's.
    (_site_packages(venv) / "test-venv-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--no-deps", wheel, cwd=work)
    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    return Installed(wheel, venv, elsewhere)


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def test_the_wheel_carries_every_bundled_data_file(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    bundled = {f"bot/bundled_playbooks/{path.name}" for path in (REPO / "playbooks").glob("*.yaml")}
    assert "bot/bundled_playbooks/xid_catalog.yaml" in bundled
    assert "bot/bundled_playbooks/xid74_registers.yaml" in bundled
    assert bundled <= names
    rules = {f"bot/bundled_rules/{path.name}" for path in (REPO / "config" / "rules").glob("*.yml")}
    assert "bot/bundled_rules/monitoring-alerts.yml" in rules
    assert rules <= names
    pages = {f"bot/pages/{path.relative_to(REPO / 'bot' / 'pages')}" for path in (REPO / "bot" / "pages").glob("*/*.*")}
    assert {"bot/pages/templates/incident.html", "bot/pages/static/pages.js", "bot/pages/static/pages.css"} <= pages
    assert pages <= names


def test_the_installed_bot_renders_its_pages_from_the_installed_package(installed: Installed) -> None:
    shown = (
        "from importlib.resources import files; from bot.pages.templates import render; "
        "print(render('refused.html', prefix='/pages', title='<t>', message='m')); "
        "print(len(files('bot.pages').joinpath('static', 'pages.js').read_bytes()))"
    )
    done = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", shown],
        cwd=installed.elsewhere,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "<h1>&lt;t&gt;</h1>" in done.stdout and int(done.stdout.split()[-1]) > 1000


def test_the_installed_bot_reads_its_playbooks_from_the_installed_package(installed: Installed) -> None:
    done = subprocess.run(
        [
            str(installed.venv / "bin" / "python"),
            "-c",
            "from bot.config import BUNDLED_PLAYBOOKS; print(BUNDLED_PLAYBOOKS)",
        ],
        cwd=installed.elsewhere,
        env=_clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(done.stdout.strip()).is_relative_to(_site_packages(installed.venv).resolve())


def test_xid_decodes_with_the_bundled_catalog(installed: Installed) -> None:
    done = installed.command("xid", stdin=XID_79_LINE + "\n")
    assert done.returncode == 0, done.stderr
    event = json.loads(done.stdout)
    assert (event["xid"], event["known"], event["name"]) == (79, True, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")


def test_check_config_loads_the_bundled_playbooks(installed: Installed) -> None:
    config = installed.elsewhere / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": "bot.db"}}))
    done = installed.command("check-config", str(config))
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, f"{config}: OK", "")


def test_version_names_the_installed_distribution(installed: Installed) -> None:
    done = installed.command("--version")
    version = installed.wheel.name.split("-")[1]
    assert (done.returncode, done.stdout.strip()) == (0, f"gpu-alert-bot {version}")


def test_serve_becomes_ready_and_the_healthcheck_finds_it(installed: Installed) -> None:
    port = free_port()
    config = installed.elsewhere / "serve.yaml"
    config.write_text(yaml.safe_dump({"server": {"listen": f"127.0.0.1:{port}"}, "store": {"path": "serve.db"}}))
    bot = ManagedProcess(
        [str(installed.venv / "bin" / "gpu-alert-bot"), "serve", "--config", str(config)],
        cwd=installed.elsewhere,
        env=dict(_clean_env(), PYTHONUNBUFFERED="1"),
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=60, process=bot.process)
        probe = installed.command("healthcheck", "--config", str(config))
        assert (probe.returncode, probe.stdout.strip()) == (0, f"http://127.0.0.1:{port}/healthz: alive")
    finally:
        assert bot.stop(signal.SIGTERM) == 0, bot.stderr.snapshot()
    assert (installed.elsewhere / "serve.db").is_file()

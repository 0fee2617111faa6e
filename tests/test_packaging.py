"""The bot as a user installs it: a wheel built from the sources the Dockerfile copies, installed (not editable)
into a fresh venv, run from a directory that is not the checkout. Its playbooks and Xid catalog come from the
wheel or nowhere."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.processes import REPO, ManagedProcess, find_binary, free_port, wait_http

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


UNIT = REPO / "deploy" / "systemd" / "gpu-alert-bot.service"
VM_CONFIG = REPO / "deploy" / "systemd" / "bot.yaml"


def unit_settings(text: str) -> dict[str, list[str]]:
    """`Section.Key` and its values in order (a key may be given more than once), as systemd reads a unit file."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key}", []).append(value)
    return settings


def test_systemd_finds_nothing_wrong_in_the_unit_starting_the_installed_wheel(
    installed: Installed, tmp_path: Path
) -> None:
    unit = tmp_path / UNIT.name  # systemd reads the unit's name from its file's
    unit.write_text(UNIT.read_text().replace("/opt/gpu-alert-bot", str(installed.venv)))
    verified = subprocess.run(
        [find_binary("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # Unknown keys and values it cannot parse are warnings on stderr, with exit status 0.
    assert (verified.returncode, verified.stderr) == (0, "")


def test_the_unit_serves_the_vm_configuration_from_its_state_directory_and_credentials(
    installed: Installed, tmp_path: Path
) -> None:
    """The unit's command, environment and directories with deploy/systemd/bot.yaml, as systemd gives them to the
    bot: each of the unit's places moved under tmp_path."""
    settings = unit_settings(UNIT.read_text())
    assert settings["Service.StateDirectory"] == settings["Service.CacheDirectory"] == ["gpu-alert-bot"]
    assert settings["Service.WorkingDirectory"] == ["/var/lib/gpu-alert-bot"]
    places = {
        "/opt/gpu-alert-bot": installed.venv,
        "/etc/gpu-alert-bot": tmp_path / "etc",
        "/var/lib/gpu-alert-bot": tmp_path / "state",  # StateDirectory=
        "/var/cache/gpu-alert-bot": tmp_path / "cache",  # CacheDirectory=
        "/run/credentials/gpu-alert-bot.service": tmp_path / "credentials",  # $CREDENTIALS_DIRECTORY
    }

    def here(text: str) -> str:
        for path, place in places.items():
            text = text.replace(path, str(place))
        return text

    for place in places.values():
        place.mkdir(exist_ok=True)
    # LoadCredential=ID:DIRECTORY: each file of the directory becomes the credential ID_<file name>.
    [credential] = settings["Service.LoadCredential"]
    name, _, source = credential.partition(":")
    secrets = Path(here(source))
    secrets.mkdir()
    (secrets / "webhook_token").write_text("webhook-s3cret\n")
    for secret in secrets.iterdir():
        shutil.copy(secret, places["/run/credentials/gpu-alert-bot.service"] / f"{name}_{secret.name}")
    [command] = settings["Service.ExecStart"]
    argv = here(command).split()
    config = yaml.safe_load(here(VM_CONFIG.read_text()))
    port = free_port()
    config["server"]["listen"] = f"127.0.0.1:{port}"
    assert argv[1:3] == ["serve", "--config"]
    Path(argv[3]).write_text(yaml.safe_dump(config))
    environment = dict(pair.split("=", 1) for line in settings["Service.Environment"] for pair in here(line).split())
    bot = ManagedProcess(
        argv,
        cwd=Path(here(settings["Service.WorkingDirectory"][0])),
        env=dict(
            _clean_env(), CREDENTIALS_DIRECTORY=str(places["/run/credentials/gpu-alert-bot.service"]), **environment
        ),
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=60, process=bot.process)
        webhook = f"http://127.0.0.1:{port}/alertmanager"
        assert httpx.post(webhook, json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401
        told = httpx.post(webhook, json={}, headers={"Authorization": "Bearer webhook-s3cret"}).status_code
        assert told == 400  # past the token read from the credential: an empty body refused as such
    finally:
        assert bot.stop(signal.SIGTERM) == 0, bot.stderr.snapshot()
    assert (places["/var/lib/gpu-alert-bot"] / "gpu-alert-bot.db").is_file()


def test_every_advice_naming_a_systemd_unit_of_the_bot_names_the_shipped_one() -> None:
    """`systemctl status gpu-alert-bot`, `journalctl -u gpu-alert-bot` in the bot's words and the docs: the unit of
    deploy/systemd, not one no install has."""
    advice = re.compile(r"(?:systemctl (?:[a-z-]+ )+|journalctl (?:-[a-z] \S+ )*-u )(gpu-alert-bot[\w@.-]*)")
    texts = [
        *(REPO / "bot").rglob("*.py"),
        *(REPO / "docs").glob("*.md"),
        *(REPO / "deploy").rglob("*"),
        REPO / "README.md",
    ]
    named = {
        (path.relative_to(REPO).as_posix(), unit.removesuffix(".service"))
        for path in texts
        if path.is_file()
        for unit in advice.findall(path.read_text(errors="replace"))
    }
    shipped = {unit.stem for unit in (REPO / "deploy" / "systemd").glob("*.service")}
    assert shipped == {"gpu-alert-bot"}
    assert named, "no advice names a unit: the pattern no longer finds them"
    assert {(path, unit) for path, unit in named if unit not in shipped} == set()

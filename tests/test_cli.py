"""`gpu-alert-bot serve` and `check-config` as a user runs them: real processes, from any working directory."""

from __future__ import annotations

import argparse
import http.server
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from bot.commands.cli import build_parser, main
from bot.commands.healthcheck import probe_url
from tests.support.payloads import am_alert, body, webhook
from tests.support.processes import BotProcess, ManagedProcess, free_port, wait_http

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "config" / "bot.example.yaml"
CLI = Path(sys.executable).parent / "gpu-alert-bot"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 (what the tests ask for; the bot must refuse it without credentials)


def _wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _json_lines(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in lines if line.strip()]


def test_check_config_accepts_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.strip() == f"{EXAMPLE}: OK"


def test_check_config_prints_each_problem_with_its_key_path_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "server": {"listen": "everywhere", "auth": {"bearer_token_file": "missing-token"}},
                "store": {"retention": "forever"},
                "outbox": {"max_backof": "5m"},
            }
        )
    )
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:4] == [
        f"{bad}:6: server.listen: expected HOST:PORT, for example 127.0.0.1:9095 or 0.0.0.0:9095",
        f"{bad}:5: server.auth.bearer_token_file: cannot read secret file {tmp_path / 'missing-token'}: "
        "No such file or directory",
        f"{bad}:8: store.retention: 'forever' is not a duration such as 30s, 15m or 2h",
        f"{bad}:2: outbox.max_backof: unknown key (check the spelling against config/bot.example.yaml)",
    ]
    assert err[4] == f"{bad}: 4 problem(s)"


def test_check_config_prints_every_problem_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's example: a receiver the routing names is checked even when other keys are wrong."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "server": {"listen": 9095, "auth": {"bearer_token_file": "/run/secrets/webhook_token"}},
                "routing": {"default": ["console", "slack"]},
            }
        )
    )
    assert main(["check-config", str(bad)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{bad}:8: server.listen: expected HOST:PORT, for example 127.0.0.1:9095 or 0.0.0.0:9095 "
        "(got the number 9095: a port alone, with no host)",
        f"{bad}:7: server.auth.bearer_token_file: cannot read secret file /run/secrets/webhook_token: "
        "No such file or directory",
        f"{bad}:4: routing.default.1: 'slack' is not a configured receiver (configured: console)",
        f"{bad}: 3 problem(s)",
    ]


def test_a_bad_listen_option_is_reported_as_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--listen", "127.0.0.1:99999"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "gpu-alert-bot serve: error: argument --listen: expected HOST:PORT, for example 127.0.0.1:9095 or 0.0.0.0:9095"
    )
    assert "server.listen" not in err


def test_output_into_a_pipe_nobody_reads_any_more_ends_quietly(tmp_path: Path) -> None:
    """The reader left before the command wrote anything (`check-config ... | true`): the last write fails, on the
    flush at the end; no traceback, and 128 + SIGPIPE like any tool stopped by the broken pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(CLI), "check-config", str(EXAMPLE)], stdout=write_end, stderr=subprocess.PIPE, timeout=60, check=False
        )
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (141, b"")


def test_the_console_script_checks_a_config_from_another_directory(tmp_path: Path) -> None:
    ok = subprocess.run([str(CLI), "check-config", str(EXAMPLE)], cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    missing = subprocess.run([str(CLI), "check-config", "nope.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 2
    assert "nope.yaml: cannot read" in missing.stderr


def test_serve_runs_the_example_config_as_it_is_from_any_working_directory(tmp_path: Path) -> None:
    # A copy of the repository's config directory, so its relative store path (..) lands in tmp_path.
    shutil.copytree(REPO / "config", tmp_path / "config")
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    port = free_port()
    bot = ManagedProcess(
        [str(CLI), "serve", "--config", str(tmp_path / "config" / "bot.example.yaml"), "--listen", f"127.0.0.1:{port}"],
        cwd=elsewhere,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", timeout=60, process=bot.process)
        assert httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
        answer = httpx.post(
            f"http://127.0.0.1:{port}/alertmanager",
            content=body(webhook([am_alert(host="k-ai-01", gpu="3")])),
            headers={"Content-Type": "application/json"},
        )
        assert answer.json()["status"] == "accepted"
        _wait_until(lambda: any(line.strip() for line in bot.stdout.snapshot()))
    finally:
        assert bot.stop() == 0  # SIGTERM: a clean shutdown
    assert (tmp_path / "gpu-alert-bot.db").exists()
    assert not list(elsewhere.iterdir())
    events = _json_lines(bot.stdout.snapshot())
    assert [(e["event"], e["host"], e["gpu"]) for e in events] == [("firing", "k-ai-01", "3")]
    logs = _json_lines(bot.stderr.snapshot())  # the service's own logs: JSON, on stderr
    assert any(entry["msg"] == "gpu-alert-bot ready" for entry in logs)


def _accepts_on(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex((address, port)) == 0


def _serve_on_all_interfaces(tmp_path: Path, settings: dict[str, object]) -> tuple[ManagedProcess, int]:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "bot.db")}, **settings}))
    port = free_port()
    bot = ManagedProcess(
        [str(CLI), "serve", "--config", str(config), "--listen", f"{ALL_INTERFACES}:{port}"], cwd=tmp_path
    )
    wait_http(f"http://127.0.0.1:{port}/healthz", process=bot.process)
    return bot, port


def test_without_credentials_the_bot_listens_on_loopback_only_and_says_so(tmp_path: Path) -> None:
    bot, port = _serve_on_all_interfaces(tmp_path, {})
    try:
        # 127.0.0.2 reaches a socket bound to 0.0.0.0 but not one bound to 127.0.0.1 (Linux routes 127/8 locally).
        assert not _accepts_on("127.0.0.2", port)
        assert _accepts_on("127.0.0.1", port)
    finally:
        bot.stop()
    logs = _json_lines(bot.stderr.snapshot())
    warning = next(e for e in logs if "loopback only" in str(e["msg"]))
    assert warning["level"] == "warning"
    assert warning["requested"] == ALL_INTERFACES and warning["listening"] == "127.0.0.1"
    ready = next(e for e in logs if e["msg"] == "gpu-alert-bot ready")
    assert ready["listen"] == f"127.0.0.1:{port}" and ready["auth"] == "off"


def test_with_credentials_the_bot_listens_where_it_is_told(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("a-long-enough-token")
    bot, port = _serve_on_all_interfaces(tmp_path, {"server": {"auth": {"bearer_token_file": "token"}}})
    try:
        assert _accepts_on("127.0.0.2", port)
    finally:
        bot.stop()
    assert not any("loopback only" in str(e["msg"]) for e in _json_lines(bot.stderr.snapshot()))


def test_a_second_bot_on_the_same_store_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"store": {"path": str(tmp_path / "bot.db")}}))
    first = BotProcess(config)
    try:
        second = subprocess.run(
            [str(CLI), "serve", "--config", str(config), "--listen", f"127.0.0.1:{free_port()}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        first.stop()
    assert second.returncode == 1
    [error] = [e for e in _json_lines(second.stderr.splitlines()) if e["level"] == "error"]
    assert error["msg"] == "cannot start" and "in use by another gpu-alert-bot process" in str(error["reason"])


def test_serve_with_a_bad_config_prints_the_problems_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text("worker: {concurrency: lots}\n")
    result = subprocess.run([str(CLI), "serve", "--config", str(config)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{config}:1: worker.concurrency: expected a whole number, not 'lots'")


def test_store_override_is_relative_to_the_working_directory(tmp_path: Path) -> None:
    config = tmp_path / "etc" / "bot.yaml"
    config.parent.mkdir()
    config.write_text(yaml.safe_dump({"store": {"path": "from-config.db"}}))
    workdir = tmp_path / "work"
    workdir.mkdir()
    port = free_port()
    bot = ManagedProcess(
        [str(CLI), "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}", "--store", "cli.db"], cwd=workdir
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=bot.process)
    finally:
        bot.stop()
    assert (workdir / "cli.db").exists()
    assert not (config.parent / "from-config.db").exists()


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpu-alert-bot {importlib.metadata.version('gpu-alert-bot')}"


def test_healthcheck_asks_the_port_the_configuration_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"server": {"listen": f"{ALL_INTERFACES}:{port}"}, "store": {"path": "bot.db"}}))
    url = f"http://127.0.0.1:{port}/healthz"
    bot = BotProcess(config, listen_port=port)
    try:
        assert main(["healthcheck", "--config", str(config)]) == 0
        assert capsys.readouterr().out.strip() == f"{url}: alive"
        assert main(["healthcheck", "--config", str(config), "--ready"]) == 0
        assert capsys.readouterr().out.strip() == f"http://127.0.0.1:{port}/readyz: ready"
    finally:
        bot.stop()
    assert main(["healthcheck", "--config", str(config), "--timeout", "1s"]) == 1
    assert capsys.readouterr().err.startswith(f"{url}: ")


class _NotReady(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # quiet test output
        pass


def test_healthcheck_ready_fails_while_readyz_answers_503(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotReady) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        config = tmp_path / "bot.yaml"
        config.write_text(yaml.safe_dump({"server": {"listen": f"127.0.0.1:{port}"}}))
        try:
            assert main(["healthcheck", "--config", str(config)]) == 0
            assert main(["healthcheck", "--config", str(config), "--ready"]) == 1
        finally:
            server.shutdown()
    assert capsys.readouterr().err.strip() == f"http://127.0.0.1:{port}/readyz: HTTP 503"


def test_healthcheck_reports_a_bad_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text(yaml.safe_dump({"server": {"listen": "everywhere"}}))
    assert main(["healthcheck", "--config", str(config)]) == 2
    assert "server.listen: expected HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "url"),
    [
        (ALL_INTERFACES, "http://127.0.0.1:9095/healthz"),
        ("::", "http://[::1]:9095/healthz"),
        ("::1", "http://[::1]:9095/healthz"),
    ],
)
def test_healthcheck_reaches_a_wildcard_listener_on_its_loopback(host: str, url: str) -> None:
    assert probe_url(host, 9095) == url


def _arguments(parser: argparse.ArgumentParser, command: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every argument of every command and subcommand, with the command it belongs to."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _arguments(sub, f"{command} {name}")
        else:
            yield command, action


def test_every_argument_of_every_command_has_help() -> None:
    arguments = list(_arguments(build_parser(), "gpu-alert-bot"))
    assert len({command for command, _ in arguments}) >= 16
    assert [(command, action.dest) for command, action in arguments if not action.help] == []

"""The checks scripts/test-image runs on the built image, with podman, as a user would run the container. Each
prints `PASS name: detail` or `FAIL name: reason`; the exit status is 1 when any failed.

    .venv/bin/python -m tests.image.checks --image localhost/gpu-alert-bot:test

The Slack receiver posts to the loopback Slack fake (tests/fakes/slack.py), which runs in a thread of this process
and which the container reaches on the host's loopback (`--network host`). Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import yaml

from tests.fakes.slack import DEFAULT_TOKEN, FakeSlack
from tests.image.compose import check_compose_files, check_compose_service
from tests.image.inside import CONTENTS, GRAPH, PROCESSES
from tests.image.podman import Containers, host_port, http_status, output, podman, wait_for
from tests.support.payloads import am_alert, body, webhook

REPO = Path(__file__).resolve().parents[2]
CONFIG = "/etc/gpu-alert-bot/bot.yaml"
STORE = "/var/lib/gpu-alert-bot/gpu-alert-bot.db"
TOKEN = "image-check-webhook-token"
UID = 10001
BUILD_TOOLS = ("gcc", "cc", "c++", "make", "ld", "as", "git")


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def check(self, name: str, test: Callable[[], str]) -> bool:
        """Run one check: it returns a detail for the PASS line, or raises (AssertionError, TimeoutError...)."""
        started = time.monotonic()
        try:
            detail = test()
        except Exception as exc:
            self.failed.append(name)
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            return False
        print(f"PASS {name}: {detail} ({time.monotonic() - started:.1f} s)", flush=True)
        return True


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def _alert_payload(host: str) -> bytes:
    now = datetime.now(UTC)
    alert = am_alert("GPUXidError", starts_at=now, host=host, gpu="0", xid="79", instance=f"{host}:9400")
    return body(webhook([alert], group_key=f'{{}}:{{host="{host}"}}'))


def _run_in(image: str, *args: str, volumes: tuple[str, ...] = (), timeout: float = 60.0) -> str:
    mounts = [item for volume in volumes for item in ("--volume", volume)]
    done = podman("run", "--rm", *mounts, image, *args, timeout=timeout)
    _require(done.returncode == 0, f"exit {done.returncode}: {output(done)[-800:]}")
    return done.stdout


class ImageChecks:
    def __init__(self, image: str, workdir: Path, report: Report) -> None:
        self.image = image
        self.workdir = workdir
        self.report = report
        self.containers = Containers(f"gpu-alert-bot-check-{os.getpid()}")

    # --- the image itself ----------------------------------------------------------------------------------
    def image_facts(self) -> str:
        done = podman("image", "inspect", self.image)
        _require(done.returncode == 0, output(done))
        info = json.loads(done.stdout)[0]
        config = info["Config"]
        _require(config.get("User") == "gpu-alert-bot", f"USER is {config.get('User')!r}")
        healthcheck = info.get("Healthcheck") or config.get("Healthcheck")
        _require(bool(healthcheck and healthcheck.get("Test")), "no HEALTHCHECK in the image (built as OCI?)")
        return f"user {config['User']}, {info['Size'] / 1e6:.0f} MB, HEALTHCHECK {' '.join(healthcheck['Test'][1:])}"

    def version(self) -> str:
        expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        printed = _run_in(self.image, "gpu-alert-bot", "--version").strip()
        _require(printed.endswith(expected), f"--version printed {printed!r}, pyproject.toml says {expected}")
        return printed

    def xid_explain(self) -> str:
        printed = _run_in(self.image, "gpu-alert-bot", "xid", "--explain", "79")
        _require("79" in printed and "fallen off" in printed.lower(), f"unexpected: {printed[:300]!r}")
        return printed.strip().splitlines()[0]

    def contents(self) -> str:
        script = CONTENTS.replace("TOOLS", repr(BUILD_TOOLS))
        found = json.loads(_run_in(self.image, "python", "-c", script, timeout=120))
        playbooks = sorted(
            p.name for p in (REPO / "playbooks").iterdir() if p.suffix == ".yaml" or p.name == "README.md"
        )
        rules = sorted(p.name for p in (REPO / "config" / "rules").glob("*.yml"))
        _require(found["playbooks"] == playbooks, f"bundled playbooks {found['playbooks']} != {playbooks}")
        _require(found["rules"] == rules, f"bundled rules {found['rules']} != {rules}")
        # site-packages, or dist-packages with the stand-in base's Debian Python.
        _require(Path(found["package"]).parent.name.endswith("-packages"), f"bot imported from {found['package']}")
        _require(not found["sources"], f"source tree in the image: {found['sources']}")
        _require(not found["tools"], f"build tools in the image: {found['tools']}")
        tools = "/".join(BUILD_TOOLS)
        return f"{len(playbooks)} playbook and {len(rules)} rule files in {found['package']}; no source, no {tools}"

    def graph(self) -> str:
        drawn = json.loads(_run_in(self.image, "python", "-c", GRAPH, timeout=120))
        _require(drawn["png"] and drawn["bytes"] > 1000, f"not a PNG: {drawn}")
        return f"a {drawn['bytes']}-byte PNG drawn by bot.render.graph (the graphs extra is installed)"

    def check_compose_config(self) -> str:
        secrets = self._secrets({"webhook_token": TOKEN})
        printed = _run_in(
            self.image,
            "gpu-alert-bot",
            "check-config",
            CONFIG,
            volumes=(
                f"{REPO / 'config' / 'bot.compose.yaml'}:{CONFIG}:ro",
                f"{REPO / 'playbooks'}:/etc/gpu-alert-bot/playbooks:ro",
                f"{secrets / 'webhook_token'}:/run/secrets/webhook_token:ro",
            ),
        )
        return printed.strip().splitlines()[-1] if printed.strip() else "exit 0"

    # --- a running container ------------------------------------------------------------------------------
    def _secrets(self, files: dict[str, str]) -> Path:
        directory = Path(tempfile.mkdtemp(dir=self.workdir))
        for name, value in files.items():
            (directory / name).write_text(value + "\n")
            (directory / name).chmod(0o444)  # the container's uid 10001 reads files mounted one by one
        return directory

    def _config(self, name: str, config: dict[str, object]) -> Path:
        path = self.workdir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o444)
        return path

    def _start(self, role: str, config: Path, *options: str) -> str:
        name = self.containers.name(role)
        done = podman("run", "--detach", "--name", name, "--volume", f"{config}:{CONFIG}:ro", *options, self.image)
        _require(done.returncode == 0, f"podman run: {output(done)}")
        return name

    def serving(self) -> None:
        """One container as the README runs it: published port, bearer token, store on a volume, read-only."""
        config = self._config(
            "serving",
            {
                "server": {"listen": "0.0.0.0:9095", "auth": {"bearer_token_file": "/run/secrets/webhook_token"}},
                "store": {"path": STORE},
                "receivers": [{"name": "console", "type": "console"}],
                "routing": {"default": ["console"]},
            },
        )
        secrets = self._secrets({"webhook_token": TOKEN})
        volume = self.containers.volume("data")
        port = host_port()
        url = f"http://127.0.0.1:{port}"
        options = (
            "--publish",
            f"127.0.0.1:{port}:9095",
            "--volume",
            f"{secrets / 'webhook_token'}:/run/secrets/webhook_token:ro",
            "--volume",
            f"{volume}:/var/lib/gpu-alert-bot",
            "--read-only",
            "--tmpfs",
            "/tmp",
        )
        host = f"image-check-{os.getpid()}"
        first: list[str] = []
        check = self.report.check

        def started() -> str:
            first.append(self._start("serving", config, *options))
            wait_for("200 from /readyz", lambda: True if http_status(f"{url}/readyz") == 200 else None)
            return f"{first[0]} ready on {url}"

        if not check("container starts and gets ready", started):
            print(output(podman("logs", *first[:1])) if first else "", flush=True)
            return
        name = first[0]
        check("/healthz and /readyz through the published port", lambda: self._probes(url))
        check("processes: serve and its worker, all as uid 10001", lambda: self._processes(name))
        check("bearer token: refused without or wrong, accepted right", lambda: self._bearer(url, host))
        check("console line in the container's log", lambda: self._console_line(name, host))
        check("HEALTHCHECK exits 0 (podman healthcheck run)", lambda: self._healthcheck(name))
        check("--read-only: / refuses writes, the tmpfs takes them", lambda: self._read_only(name))
        check("SIGTERM (podman stop): exit 0, quickly", lambda: self._sigterm(name))
        check("store survives: a new container on the volume", lambda: self._store_survives(config, options, url, host))

    @staticmethod
    def _probes(url: str) -> str:
        statuses = {path: http_status(f"{url}{path}") for path in ("/healthz", "/readyz")}
        _require(all(status == 200 for status in statuses.values()), f"answers {statuses}")
        return f"{statuses}"

    @staticmethod
    def _processes(name: str) -> str:
        done = podman("exec", name, "python", "-c", PROCESSES)
        _require(done.returncode == 0, output(done))
        processes = json.loads(done.stdout)
        bot = [p for p in processes if "gpu-alert-bot" in p["cmdline"] and "python -c" not in p["cmdline"]]
        others = [p for p in bot if p["uid"] != UID]
        _require(not others, f"not uid {UID}: {others}")
        serve = [p for p in bot if " serve " in f"{p['cmdline']} " and "worker" not in p["cmdline"]]
        workers = [p for p in bot if "worker" in p["cmdline"]]
        _require(len(serve) == 1 and len(workers) == 1, f"expected serve and one worker: {bot}")
        return f"{serve[0]['cmdline']!r} and {workers[0]['cmdline']!r}"

    @staticmethod
    def _bearer(url: str, host: str) -> str:
        payload = _alert_payload(host)
        headers = {"Content-Type": "application/json"}
        without = http_status(f"{url}/alertmanager", method="POST", content=payload, headers=headers)
        wrong = {**headers, "Authorization": "Bearer not-the-token"}
        wrong_status = http_status(f"{url}/alertmanager", method="POST", content=payload, headers=wrong)
        right = {**headers, "Authorization": f"Bearer {TOKEN}"}
        right_status = http_status(f"{url}/alertmanager", method="POST", content=payload, headers=right)
        _require((without, wrong_status, right_status) == (401, 401, 200), f"{without}, {wrong_status}, {right_status}")
        return f"without {without}, wrong {wrong_status}, right {right_status}"

    @staticmethod
    def _console_line(name: str, host: str) -> str:
        def line() -> dict[str, object] | None:
            for text in podman("logs", name).stdout.splitlines():
                if text.startswith("{") and f'"host": "{host}"' in text:
                    parsed: dict[str, object] = json.loads(text)
                    return parsed
            return None

        found = wait_for(f"console line for host {host}", line, timeout=30)
        _require(found["event"] == "firing" and found["alertname"] == "GPUXidError", f"line {found}")
        return f"event {found['event']}, alertname {found['alertname']}, host {found['host']}"

    @staticmethod
    def _healthcheck(name: str) -> str:
        done = podman("healthcheck", "run", name)
        _require(done.returncode == 0, f"exit {done.returncode}: {output(done)}")
        return output(done) or "exit 0"

    @staticmethod
    def _read_only(name: str) -> str:
        root = podman("exec", name, "python", "-c", "open('/etc/gpu-alert-bot/x', 'w')")
        _require(root.returncode != 0 and "Read-only file system" in root.stderr, f"writing /etc: {output(root)}")
        tmp = podman("exec", name, "python", "-c", "open('/tmp/x', 'w').write('x')")
        _require(tmp.returncode == 0, f"writing /tmp: {output(tmp)}")
        return "/etc: Read-only file system; /tmp: written"

    @staticmethod
    def _sigterm(name: str) -> str:
        started = time.monotonic()
        done = podman("stop", "--time", "20", name)
        took = time.monotonic() - started
        _require(done.returncode == 0, output(done))
        code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        _require(code == "0", f"exit code {code} after {took:.1f} s")
        _require(took < 10, f"took {took:.1f} s")
        return f"exit 0 in {took:.1f} s"

    def _store_survives(self, config: Path, options: tuple[str, ...], url: str, host: str) -> str:
        name = self._start("serving-again", config, *options)
        wait_for("200 from /readyz", lambda: True if http_status(f"{url}/readyz") == 200 else None)
        done = podman("exec", name, "gpu-alert-bot", "gpus", "--config", CONFIG, "--format", "json")
        _require(done.returncode == 0, output(done))
        rows = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        mine = [row for row in rows if host in json.dumps(row)]
        _require(bool(mine), f"host {host} not in the store after the restart: {done.stdout[:500]}")
        stop = podman("stop", "--time", "20", name)
        _require(stop.returncode == 0, output(stop))
        return f"{len(mine)} row(s) for {host} read back by `gpu-alert-bot gpus` in {name}"

    # --- Slack --------------------------------------------------------------------------------------------
    def slack(self) -> str:
        with _slack_fake() as fake:
            port = host_port()
            config = self._config(
                "slack",
                {
                    "server": {"listen": f"127.0.0.1:{port}"},
                    "store": {"path": "/tmp/gpu-alert-bot.db"},
                    "receivers": [
                        {
                            "name": "slack-gpu",
                            "type": "slack",
                            "channel": "#gpu-alerts",
                            "token_file": "/run/secrets/slack_bot_token",
                            "api_url": f"{fake.base_url}/api/",
                        }
                    ],
                    "routing": {"default": ["slack-gpu"]},
                },
            )
            secrets = self._secrets({"slack_bot_token": DEFAULT_TOKEN})
            name = self._start(
                "slack",
                config,
                "--network",
                "host",
                "--tmpfs",
                "/tmp",
                "--volume",
                f"{secrets / 'slack_bot_token'}:/run/secrets/slack_bot_token:ro",
            )
            url = f"http://127.0.0.1:{port}"
            wait_for("200 from /readyz", lambda: True if http_status(f"{url}/readyz") == 200 else None)
            host = f"image-slack-{os.getpid()}"
            headers = {"Content-Type": "application/json"}
            status = http_status(f"{url}/alertmanager", method="POST", content=_alert_payload(host), headers=headers)
            _require(status == 200, f"webhook answered {status}")
            wait_for("a chat.postMessage", lambda: True if _posts(fake) else None, timeout=30)
            # After a graceful stop nothing more can be sent: the count is final.
            stop = podman("stop", "--time", "20", name)
            _require(stop.returncode == 0, output(stop))
            posts = _posts(fake)
            _require(len(posts) == 1, f"{len(posts)} posts: {posts}")
            _require(host in json.dumps(posts[0]), f"the post is not about {host}: {posts[0]}")
            return f"one chat.postMessage to {posts[0].get('channel')} on {fake.base_url}"


def _posts(fake: FakeSlack) -> list[dict[str, object]]:
    return [call.args for call in list(fake.calls) if call.method == "chat.postMessage"]


@contextmanager
def _slack_fake() -> Iterator[FakeSlack]:
    """The Slack fake in a thread of its own with its own event loop, on the host's loopback."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    fake = FakeSlack()
    asyncio.run_coroutine_threadsafe(fake.start(), loop).result(timeout=10)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True)
    args = parser.parse_args(argv)
    report = Report()
    workdir = Path(tempfile.mkdtemp(prefix="gpu-alert-bot-image-"))
    checks = ImageChecks(args.image, workdir, report)
    try:
        report.check("image: user, size, HEALTHCHECK", checks.image_facts)
        report.check("--version inside", checks.version)
        report.check("xid --explain 79 inside", checks.xid_explain)
        report.check("contents: bundled data, no source tree, no build tools", checks.contents)
        report.check("an alert graph renders inside (matplotlib, non-root)", checks.graph)
        report.check("check-config of config/bot.compose.yaml inside", checks.check_compose_config)
        checks.serving()
        report.check("Slack receiver posts once to the loopback Slack fake", checks.slack)
        report.check("compose files: docker-compose config -q", check_compose_files)
        report.check(
            "compose: the bot service of docker-compose.yml up, healthy, down",
            lambda: check_compose_service(args.image, workdir),
        )
    finally:
        checks.containers.remove_all()
        shutil.rmtree(workdir, ignore_errors=True)
    if report.failed:
        print(f"FAIL {len(report.failed)} image check(s): {', '.join(report.failed)}", flush=True)
        return 1
    print("PASS every image check", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

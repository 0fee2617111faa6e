"""Hostile and broken clients against a real `serve` process, over raw sockets: slow clients, short bodies,
malformed requests, compressed bodies, two credentials. Every refusal is JSON; nothing a client sent in a
header reaches the log; the bot stays reachable.

The timeouts are configured small so the tests wait for what the bot does (close, answer), never to prove
that something did not happen. Socket timeouts only bound a test that would otherwise hang.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import ConfigError, load_config
from tests.support.bot import running_bot
from tests.support.payloads import am_alert, body, webhook
from tests.support.processes import BotProcess, ManagedProcess, find_binary, free_port, wait_http

TOKEN = "hostile-test-token-0123456789"
# A credential someone sent by mistake: it must never reach the log, whatever the bot thinks of the request.
LEAKED = "someone-elses-secret-9876543210"
BOUND = 20.0  # seconds: only so that a broken bot fails the test instead of hanging it


def serve(tmp_path: Path, **server: Any) -> BotProcess:
    return BotProcess(write_config(tmp_path, **server))


def write_config(tmp_path: Path, **server: Any) -> Path:
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    config = {
        "server": {
            "auth": {"bearer_token_file": "token"},
            "header_timeout": "500ms",
            "body_timeout": "500ms",
            "idle_timeout": "1s",
            **server,
        },
        "store": {"path": str(tmp_path / "bot.db")},
        "playbooks": {"dir": "playbooks"},
    }
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class BotWithFewFiles(ManagedProcess):
    """`serve` under a low open-file limit (prlimit), as on a host whose ulimit -n was left small."""

    def __init__(self, config: Path, open_files: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [find_binary("prlimit"), f"--nofile={open_files}", sys.executable, "-m", "bot", "serve"]
        args += ["--config", str(config), "--listen", f"127.0.0.1:{self.port}"]
        super().__init__(args, cwd=config.parent, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        wait_http(f"{self.url}/healthz", process=self.process)


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BotProcess]:
    process = serve(tmp_path_factory.mktemp("hostile"))
    yield process
    process.stop()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        assert self.headers["content-type"].startswith("application/json"), self.headers
        return json.loads(self.body)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    sock.settimeout(BOUND)
    return sock


def read_answer(sock: socket.socket) -> Answer:
    response = HTTPResponse(sock)
    response.begin()
    data = response.read()
    return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)


def exchange(port: int, request: bytes) -> Answer:
    with connect(port) as sock:
        sock.sendall(request)
        return read_answer(sock)


def healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: bot\r\n\r\n")
            return read_answer(sock).status == 200
    except (OSError, HTTPException):
        return False


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (waits for it, up to BOUND)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def webhook_request(
    payload: bytes, *, headers: tuple[str, ...] = (), length: int | None = None, auth: bool = True
) -> bytes:
    lines = [
        "POST /alertmanager HTTP/1.1",
        "Host: bot",
        "Content-Type: application/json",
        f"Content-Length: {len(payload) if length is None else length}",
        *([f"Authorization: Bearer {TOKEN}"] if auth else []),
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


PAYLOAD = body(webhook([am_alert(host="k-ai-01", gpu="0")]))


def metric(port: int, name: str, kind: str) -> float:
    answer = exchange(port, b"GET /metrics HTTP/1.1\r\nHost: bot\r\n\r\n")
    for line in answer.body.decode().splitlines():
        if line.startswith(f'{name}{{kind="{kind}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{kind={kind!r}}} not exported")


def wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND
    while not check():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.05)


def test_the_limits_are_checked_when_the_configuration_loads(tmp_path: Path) -> None:
    config = {"header_timeout": "0s", "body_timeout": "-1s", "idle_timeout": "soon", "max_connections": 0}
    with pytest.raises(ConfigError) as refused:
        load_config(write_config(tmp_path, **config))
    assert [p.split(":", 1)[0] for p in refused.value.problems] == [
        "server.header_timeout",
        "server.body_timeout",
        "server.idle_timeout",
        "server.max_connections",
    ]
    loaded = load_config(write_config(tmp_path, header_timeout="250ms", max_connections=8))
    assert (loaded.server.header_timeout, loaded.server.max_connections) == (0.25, 8)


# --- slow clients -------------------------------------------------------------------------------------
def test_a_connection_that_sends_nothing_is_closed(bot: BotProcess) -> None:
    with connect(bot.port) as sock:
        assert closed_by_server(sock)


def test_a_kept_alive_connection_left_idle_is_closed(bot: BotProcess) -> None:
    with connect(bot.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: bot\r\n\r\n")
        assert read_answer(sock).status == 200
        assert closed_by_server(sock)


def test_headers_trickled_byte_by_byte_are_cut_off(bot: BotProcess) -> None:
    """Slowloris: each byte arrives in time for a per-read timeout, the headers never end."""
    trickle = b"GET /healthz HTTP/1.1\r\nHost: bot\r\n" + b"X-Slow: " + b"a" * 2000
    with connect(bot.port) as sock:
        sock.settimeout(0.05)
        for byte in trickle:
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        else:
            pytest.fail("the bot waited for 2 kB of headers sent one byte per 50 ms")


def test_a_body_shorter_than_its_content_length_is_answered_503_and_not_counted_internal(bot: BotProcess) -> None:
    with connect(bot.port) as sock:
        sock.sendall(webhook_request(PAYLOAD[:20], length=len(PAYLOAD)))
        answer = read_answer(sock)
        assert answer.status == 503  # Alertmanager retries a 5xx at once
        assert answer.json["error"] == "body_timeout"
        assert answer.headers["connection"] == "close"
        assert closed_by_server(sock)
    assert metric(bot.port, "gpu_alert_bot_errors_total", "body_timeout") == 1
    assert metric(bot.port, "gpu_alert_bot_errors_total", "internal") == 0


def test_a_body_cut_short_by_the_client_is_no_internal_error(bot: BotProcess) -> None:
    with connect(bot.port) as sock:
        sock.sendall(webhook_request(PAYLOAD[:20], length=len(PAYLOAD)))
    wait_for(lambda: metric(bot.port, "gpu_alert_bot_errors_total", "incomplete_body") == 1)
    assert metric(bot.port, "gpu_alert_bot_errors_total", "internal") == 0
    assert exchange(bot.port, webhook_request(PAYLOAD)).status == 200


def test_idle_clients_past_the_connection_limit_do_not_lock_the_bot_out(tmp_path: Path) -> None:
    process = serve(tmp_path, max_connections=4, header_timeout="60s", idle_timeout="60s")
    try:
        idle = [connect(process.port) for _ in range(20)]
        answer = exchange(process.port, b"GET /healthz HTTP/1.1\r\nHost: bot\r\n\r\n")
        assert answer.status == 200
        assert answer.json == {"status": "alive"}
        # The oldest idle connections made room.
        assert closed_by_server(idle[0])
        for sock in idle:
            sock.close()
    finally:
        process.stop()
    lines = [json.loads(line) for line in process.stderr.snapshot()]
    limit = [line for line in lines if line["msg"].startswith("connection limit reached")]
    assert len(limit) == 1, "one line a minute, whatever the number of connections refused"


def test_under_a_low_open_file_limit_the_connection_limit_keeps_the_bot_reachable(tmp_path: Path) -> None:
    config = write_config(tmp_path, max_connections=16, header_timeout="60s", idle_timeout="60s")
    process = BotWithFewFiles(config, open_files=64)
    try:
        idle = [connect(process.port) for _ in range(100)]
        # A burst larger than the file table may fail a few accepts before the eviction catches up; then the
        # bot answers again while every idle client still holds its socket.
        wait_for(lambda: healthy(process.port))
        assert exchange(process.port, webhook_request(PAYLOAD)).status == 200
        for sock in idle:
            sock.close()
    finally:
        process.stop()


def test_a_full_file_table_is_logged_once_and_the_bot_recovers_when_connections_go(tmp_path: Path) -> None:
    config = write_config(tmp_path, max_connections=1000, header_timeout="60s", idle_timeout="60s")
    process = BotWithFewFiles(config, open_files=64)
    try:
        idle = [connect(process.port) for _ in range(100)]
        wait_for(lambda: any("cannot accept connections" in line for line in process.stderr.snapshot()))
        for sock in idle:
            sock.close()
        wait_for(lambda: healthy(process.port))
    finally:
        process.stop()
    lines = [json.loads(line) for line in process.stderr.snapshot()]
    accept = [line for line in lines if line["msg"].startswith("cannot accept connections")]
    assert len(accept) == 1
    assert accept[0]["errno"] == "EMFILE"
    assert "error" not in accept[0], "no traceback"


# --- compressed bodies and credentials ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("encoding", "payload"),
    [
        ("gzip", PAYLOAD),  # claims gzip, is plain
        ("gzip", gzip.compress(b'{"alerts": [' + b" " * 10_000_000 + b"]}")),  # a bomb: 10 MB in 10 kB
        ("deflate, gzip", PAYLOAD),
        ("br", PAYLOAD),
    ],
    ids=["plain-body", "gzip-bomb", "two-encodings", "brotli"],
)
def test_compressed_webhooks_are_refused_with_415(bot: BotProcess, encoding: str, payload: bytes) -> None:
    answer = exchange(bot.port, webhook_request(payload, headers=(f"Content-Encoding: {encoding}",)))
    assert answer.status == 415
    assert answer.json["error"] == "unsupported_encoding"


def test_identity_encoding_is_accepted(bot: BotProcess) -> None:
    answer = exchange(bot.port, webhook_request(PAYLOAD, headers=("Content-Encoding: identity",)))
    assert answer.status == 200


@pytest.mark.parametrize("order", ["right-first", "wrong-first", "both-right"])
def test_two_authorization_headers_are_a_401(bot: BotProcess, order: str) -> None:
    second = {"right-first": "Bearer wrong", "wrong-first": f"Bearer {TOKEN}", "both-right": f"Bearer {TOKEN}"}[order]
    first = "Bearer wrong" if order == "wrong-first" else f"Bearer {TOKEN}"
    answer = exchange(
        bot.port, webhook_request(PAYLOAD, auth=False, headers=(f"Authorization: {first}", f"Authorization: {second}"))
    )
    assert answer.status == 401
    assert answer.json["message"] == "more than one Authorization header"
    assert answer.headers["www-authenticate"].startswith("Bearer")


async def test_without_configured_credentials_two_authorization_headers_are_ignored(tmp_path: Path) -> None:
    async with running_bot(tmp_path) as bot, httpx.AsyncClient() as client:
        headers = [("Content-Type", "application/json"), ("Authorization", "Bearer a"), ("Authorization", "Bearer b")]
        answer = await client.post(bot.webhook_url, content=PAYLOAD, headers=headers)
    assert answer.status_code == 200


# --- what the HTTP parser refuses ---------------------------------------------------------------------
_POST = b"POST /alertmanager HTTP/1.1\r\nHost: bot\r\nContent-Type: application/json\r\n"
PARSER_ERRORS = {
    "negative-content-length": _POST + b"Content-Length: -1\r\n\r\n{}",
    "two-content-lengths": _POST + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "transfer-encoding-and-content-length": _POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "tls-client-hello": bytes.fromhex("160301020001000200fc0303") + b"\x00" * 40,
    "header-over-8-kb": b"GET /healthz HTTP/1.1\r\nHost: bot\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    "control-byte-in-a-header": _POST + f"Authorization: Bearer {LEAKED}\x01\r\nContent-Length: 2\r\n\r\n{{}}".encode(),
    "bad-chunk-size": _POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
}


@pytest.mark.parametrize("request_bytes", PARSER_ERRORS.values(), ids=PARSER_ERRORS.keys())
def test_parser_errors_are_answered_with_json(bot: BotProcess, request_bytes: bytes) -> None:
    answer = exchange(bot.port, request_bytes)
    assert 400 <= answer.status < 500
    document = answer.json
    assert set(document) == {"error", "message"}
    assert document["error"]
    assert LEAKED not in answer.body.decode()


def test_a_malformed_header_is_never_logged(tmp_path: Path) -> None:
    process = serve(tmp_path)
    try:
        for name in ("control-byte-in-a-header", "two-content-lengths", "header-over-8-kb"):
            assert exchange(process.port, PARSER_ERRORS[name]).status == 400
        huge = _POST + f"Authorization: Bearer {LEAKED}".encode() + b"x" * 9000 + b"\r\n\r\n"
        assert exchange(process.port, huge).status == 400
    finally:
        process.stop()
    lines = process.stderr.snapshot()
    assert any("refused a malformed HTTP request" in line for line in lines)
    for line in lines:
        json.loads(line)
        assert LEAKED not in line
        assert "Traceback" not in line


@settings(max_examples=40, deadline=None)
@given(garbage=st.binary(max_size=300))
def test_whatever_follows_the_request_line_every_answer_is_json_and_no_500(bot: BotProcess, garbage: bytes) -> None:
    """Either the request is complete and answered (JSON, never a 500), or the bot closes it at header_timeout."""
    request = b"POST /alertmanager HTTP/1.1\r\nHost: bot\r\n" + garbage + b"\r\n\r\n"
    with connect(bot.port) as sock:
        sock.sendall(request)
        try:
            answer = read_answer(sock)
        except (HTTPException, ConnectionResetError):
            return  # closed without an answer: the headers never ended, or the bot cut an unfinished body
    assert answer.status != 500
    assert answer.headers["content-type"].startswith("application/json"), answer

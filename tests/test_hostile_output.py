"""Label values and error bodies are data: what reaches a terminal or a message prints, it never acts (no
clear screen, no OSC 8 link, no bidi override), and the escaped text still says what the value was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from bot.commands.cli import main
from bot.printable import printable, printable_json
from tests.support.payloads import am_alert, body, webhook

CLEAR_SCREEN = "\x1b[2J\x1b[H"
OSC8_LINK = "\x1b]8;;https://evil.example/\x1b\\run me\x1b]8;;\x1b\\"
C1_CSI = "\x9b31m"
BIDI = "\u202etxt.exe"
HOSTILE = f"k-ai-01{CLEAR_SCREEN}{OSC8_LINK}{C1_CSI}{BIDI}\x07"


def explain(tmp_path: Path, capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, str]:
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    config = {"store": {"path": str(tmp_path / "bot.db")}, "playbooks": {"dir": "playbooks"}}
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    alert = am_alert("GPU\x1b[31mXid", host=HOSTILE, gpu="0", annotations={"summary": f"on {HOSTILE}"})
    payload = tmp_path / "payload.json"
    payload.write_bytes(body(webhook([alert])))
    code = main(["explain", str(payload), "--config", str(tmp_path / "bot.yaml"), *options])
    return code, capsys.readouterr().out


def assert_inert(out: str) -> None:
    for control in ("\x1b", "\x9b", "\u202e", "\x07"):
        assert control not in out


def test_explain_shows_terminal_escapes_in_label_values_instead_of_sending_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = explain(tmp_path, capsys)
    assert code == 0
    assert_inert(out)
    # Shown escaped (as Python or JSON escapes, depending on the part of the report), not dropped.
    assert "\\x1b[2J" in out or "\\u001b[2J" in out
    assert "]8;;https://evil.example/" in out
    assert "\\u202etxt.exe" in out
    assert "\n" in out  # the report's own lines stay lines


def test_explain_json_escapes_them_and_keeps_the_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = explain(tmp_path, capsys, "--format", "json")
    assert code == 0
    assert_inert(out)
    report = json.loads(out)
    assert report["alerts"][0]["labels"]["host"] == HOSTILE


@given(st.text())
def test_printable_text_always_prints(text: str) -> None:
    assert printable(text).isprintable()


@given(st.text())
def test_printable_keeps_what_prints_and_the_characters_asked_for(text: str) -> None:
    shown = printable(text, keep="\n")
    assert all(line.isprintable() for line in shown.split("\n"))
    assert shown.count("\n") >= text.count("\n")
    if text.isprintable():
        assert shown == text


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(_JSON)
def test_printable_json_is_the_same_json_value_and_prints_line_by_line(value: Any) -> None:
    document = printable_json(json.dumps(value, indent=2, ensure_ascii=False))
    assert json.loads(document) == value
    assert all(line.isprintable() for line in document.split("\n"))

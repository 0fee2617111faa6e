"""`gpu-alert-bot xid [FILE]`: the operator's Xid decoder on the bot's parser and catalog, no config needed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.commands.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "kernel_logs"
CLI = Path(sys.executable).parent / "gpu-alert-bot"
UUID_5D = "GPU-f1906b9b-557a-e961-045c-9fe4be3ce012"


def run_cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str, stdin: bytes = b""
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    status = main(["xid", *args])
    out, err = capsys.readouterr()
    return status, out, err


def records(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def test_journalctl_piped_into_the_command(tmp_path: Path) -> None:
    """The real pipe, in a directory with no configuration file."""
    log = (FIXTURES / "h100_fallen_off_bus.dmesg").read_bytes()
    done = subprocess.run([str(CLI), "xid"], input=log, capture_output=True, cwd=tmp_path, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    fall, recovery = records(done.stdout.decode())
    assert {k: fall[k] for k in ("xid", "pci_bus_id", "pid", "process", "message", "uuid")} == {
        "xid": 79,
        "pci_bus_id": "00000000:5D:00.0",
        "pid": None,
        "process": None,
        "message": "GPU has fallen off the bus.",
        "uuid": UUID_5D,
    }
    assert (fall["name"], fall["severity"]) == ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "fatal")
    assert fall["action"].startswith("Drain the node and reboot it")  # Xid 154 asked for a node reboot
    assert (fall["count"], fall["serial"], fall["uptime"]) == (2, "1653923026510", 4254.19786)
    assert recovery["recovery_action"] == {
        "value": 2,
        "name": "Node Reboot Required",
        "previous_value": 0,
        "previous_name": "None",
    }


def test_file_argument(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, _ = run_cli(capsys, monkeypatch, str(FIXTURES / "kern_log.syslog"))
    assert status == 0
    found = records(out)
    assert [(r["xid"], r["pci_bus_id"], r["pid"], r["process"]) for r in found] == [
        (13, "00000000:3B:00.0", 30210, "pt_main_thread"),
        (13, "00000000:3B:00.0", 30210, "pt_main_thread"),
        (43, "00000000:3B:00.0", 30210, "pt_main_thread"),
        (48, "00000000:86:00.0", 41877, "VLLM::Worker"),
        (63, "00000000:86:00.0", None, None),
        (31, "00000000:86:00.0", 41877, "VLLM::Worker"),
    ]
    assert found[0]["uuid"] == "GPU-15704b32-f531-14ce-0530-1ac21e4b68e6"
    assert found[0]["log_time"] == "Dec  2 11:38:47"
    assert found[5]["channel"] == 2
    assert all(r["name"] and r["severity"] and r["action"] for r in found)


def test_stdin_by_default_and_dash(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    log = (FIXTURES / "gb200_nvlink.journal").read_bytes()
    for args in ((), ("-",)):
        status, out, _ = run_cli(capsys, monkeypatch, *args, stdin=log)
        assert status == 0
        found = records(out)
        assert [r["xid"] for r in found] == [145, 149, 45, 45, 154, 154]
        assert {r["pci_bus_id"] for r in found} == {"00000008:01:00.0", "00000018:01:00.0"}
        assert found[2]["caused_by"] == 149


def test_bytes_that_are_not_utf8_do_not_stop_the_decoder(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = b"\xff\xfe garbage \x80\n[ 12.5] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
    status, out, _ = run_cli(capsys, monkeypatch, stdin=log)
    assert status == 0
    assert [r["xid"] for r in records(out)] == [79]


def test_table_for_people(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, err = run_cli(capsys, monkeypatch, "--format", "table", str(FIXTURES / "h100_fallen_off_bus.dmesg"))
    assert status == 0
    header, fall, fall_action, recovery, _ = out.splitlines()
    assert header.split() == ["TIME", "PCI", "BUS", "ID", "XID", "SEVERITY", "COUNT", "PROCESS", "NAME", "/", "ACTION"]
    assert fall.split()[:5] == ["+4254.198s", "00000000:5D:00.0", "79", "fatal", "2"]
    assert fall.endswith("GPU has fallen off the bus")
    assert fall_action.strip().startswith("-> Drain the node and reboot it")
    assert recovery.split()[2] == "154"
    assert "2 Xid event(s)" in err


def test_explain_79(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, _ = run_cli(capsys, monkeypatch, "--explain", "79")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "Xid 79: GPU has fallen off the bus"
    assert "  severity:   fatal" in lines
    assert any(line.startswith("  action:     Cordon and drain the node") for line in lines)
    assert any("RESTART_BM" in line for line in lines)
    assert "  escalation: Xid 79 3 times on one GPU within 30 days (xid79-recurring)" in lines


def test_explain_as_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, _ = run_cli(capsys, monkeypatch, "--explain", "154", "--format", "json")
    assert status == 0
    entry = json.loads(out)
    assert (entry["code"], entry["name"], entry["curated"]) == (154, "GPU_RECOVERY_ACTION_CHANGED", True)


def test_explain_an_unknown_code(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    status, out, err = run_cli(capsys, monkeypatch, "--explain", "999")
    assert (status, out) == (1, "")
    assert "Xid 999 is not in the catalog" in err


def test_unknown_code_in_a_log_is_still_reported(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    status, out, _ = run_cli(capsys, monkeypatch, stdin=b"NVRM: Xid (PCI:0000:3b:00): 999, Something new\n")
    assert status == 0
    [record] = records(out)
    assert (record["xid"], record["known"], record["name"], record["severity"]) == (
        999,
        False,
        "UNKNOWN_XID",
        "warning",
    )


def test_missing_file(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    status, out, err = run_cli(capsys, monkeypatch, str(tmp_path / "absent.log"))
    assert (status, out) == (1, "")
    assert "absent.log: cannot read" in err


def test_a_custom_catalog_that_is_broken(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    broken = tmp_path / "xid_catalog.yaml"
    broken.write_text("version: 1\nxids: []\n")
    status, _, err = run_cli(capsys, monkeypatch, "--catalog", str(broken), "--explain", "79")
    assert status == 2
    assert "xids" in err


def test_a_custom_catalog_that_is_not_utf8_names_its_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    latin1 = tmp_path / "xid_catalog.yaml"
    latin1.write_bytes(b"version: 1\n# r\xe9sum\xe9\nxids: []\n")
    status, _, err = run_cli(capsys, monkeypatch, "--catalog", str(latin1), "--explain", "79")
    assert status == 2
    assert err.strip() == f"{latin1}:2: not UTF-8 text (byte 0xe9); save the file as UTF-8"


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """`gpu-alert-bot xid big.log | head -1`: no traceback once head has gone, and the status of a tool that
    SIGPIPE stopped (128 + 13), as the shell reports for cat or grep."""
    log = tmp_path / "big.log"
    lines = (
        f"NVRM: Xid (PCI:0000:3b:00): 13, pid={n}, name=p{n}, Graphics Exception: ESR 0x{n:x}" for n in range(5000)
    )
    log.write_text("\n".join(lines) + "\n")
    with subprocess.Popen([str(CLI), "xid", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as command:
        assert command.stdout is not None and command.stderr is not None
        assert json.loads(command.stdout.readline())["xid"] == 13
        command.stdout.close()
        errors = command.stderr.read()
        status = command.wait(timeout=60)
    assert (status, errors) == (141, b"")

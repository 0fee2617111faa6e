"""`gpu-alert-bot gpus --config FILE`: each GPU's history from a real SQLite store, opened read-only."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.commands.cli import main
from bot.gpu.xid_catalog import load_catalog
from bot.models import GpuEvent
from bot.store.sqlite import SqliteStore
from tests.test_recurrence import XID79, alert_from_labels
from tests.test_xid_enricher import UUID_3B

CLI = Path(sys.executable).parent / "gpu-alert-bot"
NOW = datetime.now(UTC).replace(microsecond=0)
UUID_A = "gpu-15704b32-f531-14ce-0530-1ac21e4b68e6"
UUID_B = "gpu-8e1f0c2a-7d3b-4c5e-9a6f-112233445566"


def xid(key: str, code: str, ago: timedelta, uuid: str = "", pci: str = "", host: str = "k-ai-01") -> GpuEvent:
    return GpuEvent(gpu_key=key, host=host, pci_bus_id=pci, uuid=uuid, kind="xid", code=code, at=NOW - ago)


def alert(key: str, name: str, ago: timedelta, uuid: str = "", pci: str = "", episode: str = "") -> GpuEvent:
    at = NOW - ago
    return GpuEvent(
        gpu_key=key,
        host="k-ai-01",
        pci_bus_id=pci,
        uuid=uuid,
        kind="alert",
        code=name,
        at=at,
        alert_key=episode or f"{name}@{at.isoformat()}",
    )


HISTORY = [
    # GPU A: three falls off the bus; the oldest recorded before its UUID was known (host + PCI key).
    xid("k-ai-01/00000000:3B:00.0", "79", timedelta(days=20), pci="00000000:3B:00.0"),
    xid(UUID_A, "79", timedelta(days=9), uuid=UUID_A, pci="00000000:3B:00.0"),
    xid(UUID_A, "79", timedelta(hours=2), uuid=UUID_A, pci="00000000:3B:00.0"),
    alert(UUID_A, "GPUXIDError", timedelta(hours=2), uuid=UUID_A, pci="00000000:3B:00.0"),
    # GPU B on the same host: one contained ECC error, and nonfatal NVLink noise.
    xid(UUID_B, "94", timedelta(days=2), uuid=UUID_B, pci="00000000:86:00.0"),
    xid(UUID_B, "145:nonfatal", timedelta(days=1), uuid=UUID_B, pci="00000000:86:00.0"),
    # Older than any window asked for below.
    xid("k-ai-02/00000000:01:00.0", "48", timedelta(days=60), pci="00000000:01:00.0", host="k-ai-02"),
]


def make_store(path: Path, events: list[GpuEvent]) -> None:
    async def write() -> None:
        store = SqliteStore(path)
        await store.open()
        await store.record_gpu_events(events)
        await store.close()

    asyncio.run(write())


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    make_store(tmp_path / "bot.db", HISTORY)
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"store": {"path": "bot.db"}}))
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["gpus", *args])
    out, err = capsys.readouterr()
    return status, out, err


def by_uuid(out: str) -> dict[str, dict[str, Any]]:
    return {record["uuid"] or record["gpu_key"]: record for record in map(json.loads, out.splitlines())}


def test_json_lists_each_physical_gpu(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    status, out, _ = run_cli(capsys, "--config", str(config_file), "--format", "json")
    assert status == 0
    gpus = by_uuid(out)
    assert set(gpus) == {UUID_A, UUID_B}
    a = gpus[UUID_A]
    assert (a["host"], a["pci_bus_id"], a["xids"], a["alerts"]) == (
        "k-ai-01",
        "00000000:3B:00.0",
        {"79": 3},
        {"GPUXIDError": 1},
    )
    assert [v["rule"] for v in a["verdicts"]] == ["xid79-recurring"]
    assert a["verdicts"][0]["text"].startswith("Third Xid 79 on this GPU in 30 days")
    assert (gpus[UUID_B]["xids"], gpus[UUID_B]["verdicts"]) == ({"94": 1, "145:nonfatal": 1}, [])


def test_since_narrows_the_window(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    status, out, _ = run_cli(capsys, "--config", str(config_file), "--format", "json", "--since", "3d")
    assert status == 0
    gpus = by_uuid(out)
    assert gpus[UUID_A]["xids"] == {"79": 1}
    assert gpus[UUID_A]["verdicts"] == []
    status, out, _ = run_cli(capsys, "--config", str(config_file), "--format", "json", "--since", "90d")
    assert "k-ai-02/00000000:01:00.0" in by_uuid(out)


def test_table_for_people(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    status, out, _ = run_cli(capsys, "--config", str(config_file))
    assert status == 0
    header, row_a, verdict, row_b = out.splitlines()
    assert header.split() == ["HOST", "GPU", "XIDS", "ALERTS", "LAST"]
    columns = [header.index(name) for name in ("GPU", "XIDS", "ALERTS", "LAST")]
    assert [row_a[start:end].strip() for start, end in zip([0, *columns], [*columns, None], strict=True)][:4] == [
        "k-ai-01",
        UUID_A,
        "79 x3",
        "GPUXIDError x1",
    ]
    assert row_b[columns[1] : columns[2]].strip() == "94 x1, 145 nonfatal x1"
    assert verdict.strip().startswith("! Third Xid 79 on this GPU in 30 days: hardware suspect, prepare an RMA")


def test_read_only_beside_a_running_bot(config_file: Path) -> None:
    """The bot keeps its store open (WAL) and writing; the command reads it and writes nothing."""

    async def scenario() -> None:
        store = SqliteStore(config_file.parent / "bot.db")
        await store.open()
        try:
            await store.record_gpu_events([xid(UUID_A, "48", timedelta(minutes=1), uuid=UUID_A)])
            done = subprocess.run(
                [str(CLI), "gpus", "--config", str(config_file), "--format", "json"],
                capture_output=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            assert by_uuid(done.stdout.decode())[UUID_A]["xids"] == {"48": 1, "79": 3}
            await store.record_gpu_events([xid(UUID_A, "63", timedelta(seconds=1), uuid=UUID_A)])
            await store.check_writable()
        finally:
            await store.close()

    asyncio.run(scenario())


def test_no_store_is_an_error_and_creates_nothing(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"store": {"path": "missing.db"}}))
    status, out, err = run_cli(capsys, "--config", str(path))
    assert (status, out) == (1, "")
    assert "cannot open the store" in err and "missing.db" in err
    assert not (tmp_path / "missing.db").exists()


def test_empty_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    make_store(tmp_path / "bot.db", [])
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"store": {"path": "bot.db"}}))
    status, out, err = run_cli(capsys, "--config", str(path), "--since", "24h")
    assert (status, out) == (0, "")
    assert "No GPU event recorded in the last 24 h" in err


def test_bad_since_is_a_usage_error(capsys: pytest.CaptureFixture[str], config_file: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["gpus", "--config", str(config_file), "--since", "soon"])
    assert exit_.value.code == 2


def test_xids_known_only_from_alert_labels_are_listed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No Loki: the history is what the recurrence enricher recorded from GPUXIDError's err_code label."""

    async def record() -> None:
        store = SqliteStore(tmp_path / "bot.db")
        await store.open()
        try:
            for name, ago in (("a1", timedelta(days=20)), ("a2", timedelta(days=9)), ("a3", timedelta(hours=2))):
                await alert_from_labels(store, catalog, XID79, NOW - ago, name)
            stuck = {**XID79, "alertname": "DCGMXidGaugeStuck"}
            await alert_from_labels(store, catalog, stuck, NOW - timedelta(hours=2) + timedelta(minutes=4), "stuck")
        finally:
            await store.close()

    catalog = load_catalog()
    asyncio.run(record())
    path = tmp_path / "bot.yaml"
    path.write_text(yaml.safe_dump({"store": {"path": "bot.db"}}))
    status, out, _ = run_cli(capsys, "--config", str(path), "--format", "json")
    assert status == 0
    [gpu] = by_uuid(out).values()
    assert (gpu["uuid"], gpu["xids"], gpu["alerts"]) == (
        UUID_3B,
        {"79": 3},
        {"DCGMXidGaugeStuck": 1, "GPUXIDError": 3},
    )
    assert [v["rule"] for v in gpu["verdicts"]] == ["xid79-recurring"]


def test_store_option_reads_that_store_instead_of_the_configured_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_store(tmp_path / "copy.db", HISTORY)
    monkeypatch.chdir(tmp_path)
    status, out, err = run_cli(capsys, "--store", "copy.db", "--format", "json")
    assert (status, err) == (0, "")
    assert set(by_uuid(out)) == {UUID_A, UUID_B}


@pytest.mark.parametrize("command", ["gpus", "audit"])
def test_without_config_or_store_and_no_store_here_says_how_to_name_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([command]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"no store in this folder ({tmp_path / 'gpu-alert-bot.db'}): pass --config with the bot's configuration "
        "file, or --store with its store file\n"
    )
    assert list(tmp_path.iterdir()) == []

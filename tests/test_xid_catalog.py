"""The Xid catalog as data: it loads, every reviewed code says what to do, the generator reproduces it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from bot.gpu.xid_catalog import BUNDLED_CATALOG, SEVERITIES, XidCatalogError, load_catalog
from bot.playbooks import PlaybookSet

ROOT = Path(__file__).resolve().parents[1]
# The research catalog the bundled one is generated from (a copy of ../shared/reference/xid_catalog.yaml).
REFERENCE = ROOT / "tests" / "fixtures" / "reference_xid_catalog.yaml"
SHARED_REFERENCE = ROOT.parent / "shared" / "reference" / "xid_catalog.yaml"


def test_bundled_catalog_loads_with_every_code() -> None:
    catalog = load_catalog()
    assert len(catalog.xids) == 172
    assert [e.code for e in catalog.xids] == sorted(e.code for e in catalog.xids)


def test_every_curated_code_has_name_severity_and_operator_actions() -> None:
    curated = [e for e in load_catalog().xids if e.curated]
    assert len(curated) == 46
    for entry in curated:
        assert entry.name and entry.title, entry.code
        assert entry.severity in SEVERITIES, entry.code
        assert entry.action and not entry.action.islower(), entry.code  # operator words, not a slug
        assert "_" not in entry.action.split()[0], entry.code


@pytest.mark.parametrize(
    ("code", "severity", "words", "causes"),
    [
        (79, "fatal", "reboot", {"hardware", "bus", "thermal"}),
        (48, "critical", "row remap", {"hardware"}),
        (45, "info", "Follow the Xid that caused it", {"driver", "application"}),
        (13, "warning", "Restart the application", {"application"}),
        (74, "critical", "nvlink", {"nvlink"}),
        (149, "critical", "Fatal", {"nvlink"}),
        (64, "fatal", "reset", {"hardware"}),
    ],
)
def test_known_codes(code: int, severity: str, words: str, causes: set[str]) -> None:
    entry = load_catalog().get(code)
    assert entry is not None
    assert entry.severity == severity
    assert words.lower() in entry.action.lower()
    assert causes <= set(entry.causes)
    assert entry.nvidia.immediate


def test_nvlink5_codes_are_milder_when_the_line_says_nonfatal() -> None:
    entry = load_catalog().get(145)
    assert entry is not None
    assert (entry.severity, entry.severity_if_nonfatal) == ("critical", "info")
    assert entry.action_if_nonfatal


def test_escalation_thresholds_live_in_the_catalog() -> None:
    catalog = load_catalog()
    rules = {rule.id: rule for rule in catalog.escalations}
    assert (rules["xid79-recurring"].xids, rules["xid79-recurring"].count) == ([79], 3)
    assert rules["xid79-recurring"].window == 30 * 86400
    assert (rules["fatal-xid-repeated"].count, rules["fatal-xid-repeated"].window) == (5, 86400)
    assert rules["dbe-then-remap"].followed_by == [63, 64]
    assert {r.value for r in catalog.recovery_actions} == {0, 1, 2, 3, 4}


def test_unknown_code_gets_a_stand_in() -> None:
    catalog = load_catalog()
    assert catalog.get(999) is None
    stand_in = catalog.entry(999)
    assert (stand_in.known, stand_in.severity) == (False, "warning")
    assert "999" in stand_in.title


def test_playbook_loader_skips_the_catalog_beside_the_playbooks(tmp_path: Path) -> None:
    (tmp_path / "xid_catalog.yaml").write_text(BUNDLED_CATALOG.read_text())
    PlaybookSet.load(tmp_path)  # would fail: the catalog is not a playbook


def test_a_playbook_directory_without_a_catalog_falls_back_to_the_bundled_one(tmp_path: Path) -> None:
    assert len(load_catalog(tmp_path).xids) == 172
    own = tmp_path / "xid_catalog.yaml"
    data = yaml.safe_load(BUNDLED_CATALOG.read_text())
    data["xids"] = [x for x in data["xids"] if x["code"] == 79]
    own.write_text(yaml.safe_dump(data))
    assert [e.code for e in load_catalog(tmp_path).xids] == [79]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda d: d["xids"].append(dict(d["xids"][0])), "duplicate Xid code"),
        (lambda d: d["xids"][0].update(severity="bad"), "severity"),
        (lambda d: d["xids"][0].update(action=""), "action"),
        (lambda d: d["escalations"][0].update(verdict="{oops} Xid"), "unknown placeholder"),
        (lambda d: d["escalations"][0].update(window="soon"), "window"),
        (lambda d: d["escalations"][0].pop("xids"), "xids"),
        (lambda d: d["xids"][0].update(colour="red"), "colour"),
    ],
)
def test_a_broken_catalog_is_reported_not_loaded(tmp_path: Path, change: object, problem: str) -> None:
    data = yaml.load(BUNDLED_CATALOG.read_text(), Loader=yaml.CSafeLoader)
    change(data)  # type: ignore[operator]
    path = tmp_path / "xid_catalog.yaml"
    path.write_text(yaml.dump(data, Dumper=yaml.CSafeDumper))
    with pytest.raises(XidCatalogError) as failure:
        load_catalog(path)
    assert any(problem in p for p in failure.value.problems), failure.value.problems


@pytest.mark.skipif(not SHARED_REFERENCE.is_file(), reason="../shared is not beside the repository")
def test_the_kept_reference_is_the_shared_one() -> None:
    assert REFERENCE.read_bytes() == SHARED_REFERENCE.read_bytes()


def test_generator_reproduces_the_committed_catalog(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("build_xid_catalog", ROOT / "scripts" / "build_xid_catalog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_xid_catalog"] = module
    spec.loader.exec_module(module)
    output = tmp_path / "xid_catalog.yaml"
    assert module.main(["--reference", str(REFERENCE), "--output", str(output)]) == 0
    assert output.read_text() == BUNDLED_CATALOG.read_text()

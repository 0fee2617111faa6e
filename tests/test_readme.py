"""README is for users: what the bot is, how to install, configure and operate it, and a link to each document.
Its first commands say what they install before a reader runs them, its example alert is one the shipped rules
send, and the engineering notes (the code's layout, benchmark history) are in the documents for contributors."""

from __future__ import annotations

import re

from bot.selftest.checks import shipped_alert_names
from tests.support.processes import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[str]:
    return FENCE.findall(README)


def test_the_readme_opens_with_the_two_commands() -> None:
    assert _blocks()[0].split() == ["scripts/run", "scripts/test"]


def test_before_its_first_commands_the_readme_names_what_scripts_test_installs_with_apt_get() -> None:
    before = README.split("```", 1)[0]
    script = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    packages = re.findall(r"missing\+=\(([\w-]+)\)", script)
    assert "prometheus" in packages and "slurmctld" in packages
    assert "sudo apt-get" in before
    assert [name for name in packages if f"`{name}`" not in before] == []


def test_the_example_alert_is_one_the_shipped_rules_send() -> None:
    """A routing matcher copied from the README's example must match what the shipped rules fire."""
    examples = [block for block in _blocks() if "curl" in block and "/alertmanager" in block]
    assert examples
    named = {name for block in examples for name in re.findall(r'"alertname":"(\w+)"', block)}
    assert named and named <= shipped_alert_names(REPO / "config" / "rules"), named


def test_the_readme_leaves_the_code_and_its_figures_to_the_contributors_documents() -> None:
    assert re.findall(r"\bbot/[\w/]+\.py\b", README) == []
    headings = set(re.findall(r"^#+ (.+)$", README, re.MULTILINE))
    assert not headings & {"Architecture", "Benchmarks", "Not yet"}
    assert "docs/architecture.md" in README and "bench/README.md" in README


def test_the_readme_links_every_document() -> None:
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", README))
    documents = {path.relative_to(REPO).as_posix() for path in (REPO / "docs").glob("*.md")}
    assert documents - linked == set(), "README's Further reading should link these"

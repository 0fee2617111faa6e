"""What users read speaks of the product: no playbook, README, document, configuration or manifest says "the seed"
(the design notes the project started from, which users never saw), an issue number, a commit id in angle
brackets, or how the work was done (this round, other sessions on the machine, the fixes it took); playbook
texts are rendered into messages, the others are read as they are. And the documents they point to are in the
repository: the image scripts' facts are docs/container-build.md's, not a page elsewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.processes import REPO

INTERNAL = re.compile(
    r"\bthe seed\b|\bseed(?:'s| document)\b|\bissues? #?\d+\b|<[0-9a-f]{7,40}>"
    # how the work was done: a round of work, the people and sessions who shared the machine, the fixes it took
    r"|\bthis round\b|\bother (?:sessions?|engineers)\b|\b(?:one|two|three|four) fixes\b",
    re.IGNORECASE,
)
READ_BY_USERS = ("playbooks", "docs", "config", "deploy", "bot")


def _texts() -> list[Path]:
    found = [REPO / "README.md", REPO / "Dockerfile", *REPO.glob("*/README.md")]
    for directory in READ_BY_USERS:
        for path in (REPO / directory).rglob("*"):
            if path.is_file() and path.suffix in {".md", ".yaml", ".yml", ".py", ".conf", ".ini", ".sh", ""}:
                found.append(path)
    return sorted(set(found))


def test_the_texts_are_found() -> None:
    names = {path.relative_to(REPO).as_posix() for path in _texts()}
    assert {"README.md", "bench/README.md", "playbooks/GPUXIDError.yaml", "config/rules/gpu-alerts.yml"} <= names
    assert {"docs/kubernetes.md", "config/secrets/README.md", "bot/render/graph.py"} <= names


def test_no_text_users_read_speaks_of_the_projects_own_history() -> None:
    said = []
    for path in _texts():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in INTERNAL.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            said.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)!r}")
    assert said == []


@pytest.mark.parametrize(
    "text",
    [
        "The seed's threshold",
        "as the seed notes",
        "Issue 14's figures",
        "a fleet storm (issue 21)",
        "issues 9 and 14",
        "--before <82a2b3c>",
        "Two fixes of this round",
        "on this 2-vCPU VM shared with other sessions' test runs",
        "six other engineers' test suites",
    ],
)
def test_the_check_recognises_what_it_looks_for(text: str) -> None:
    assert INTERNAL.search(text)


# A document named by a path of its own (`docs/x.md`, `../shared/reference/x.md`): not a word of a sentence.
DOCUMENT = re.compile(r"(?<![\w/.-])((?:\.\./|[\w.-]+/)+[\w.-]+\.md)\b")
IMAGE_SCRIPTS = (REPO / "scripts" / "test-image", REPO / "scripts" / "image-standin-base")


def test_every_document_the_scripts_and_the_documentation_point_to_is_in_the_repository() -> None:
    pointing = [*IMAGE_SCRIPTS, REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "Dockerfile"]
    missing = []
    for path in pointing:
        for match in DOCUMENT.finditer(path.read_text(encoding="utf-8")):
            named = match.group(1)
            target = (path.parent / named if named.startswith("../") else REPO / named).resolve()
            if not target.is_relative_to(REPO) or not target.is_file():
                missing.append(f"{path.relative_to(REPO)}: {named}")
    assert missing == []


def test_the_container_build_page_says_what_the_image_scripts_set() -> None:
    page = (REPO / "docs" / "container-build.md").read_text(encoding="utf-8")
    scripts = "\n".join(path.read_text(encoding="utf-8") for path in IMAGE_SCRIPTS)
    for setting in ("--runtime runc", "--format docker", "--pull=never", "CONTAINERS_CONF", "default_ulimits"):
        assert setting in scripts and setting in page, setting
    for step in ("--variant=minbase", "EXTERNALLY-MANAGED", "update-ca-certificates", "buildah from scratch"):
        assert step in scripts and step in page, step
    assert "docs/container-build.md" in (REPO / "scripts" / "test-image").read_text(encoding="utf-8")

"""bot/ stays a set of modules of one job each: none grows past about 400 lines unless the architecture doc for
contributors (docs/architecture.md) names it and says why."""

from __future__ import annotations

import re
from pathlib import Path

import bot

PACKAGE = Path(bot.__file__).parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
LIMIT = 400


def explained_long_modules() -> set[str]:
    """The `bot/...py` paths the architecture doc's "Longer modules" paragraph names."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    paragraph = text.split("\nLonger modules", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(bot/[\w/]+\.py)`", paragraph))


def line_counts() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }


def test_no_module_is_long_unless_the_architecture_doc_says_why() -> None:
    explained = explained_long_modules()
    unexplained = {path: lines for path, lines in line_counts().items() if lines > LIMIT and path not in explained}
    assert unexplained == {}, f"split these modules or say in docs/architecture.md why not: {unexplained}"


def test_the_architecture_doc_explains_only_modules_that_are_long() -> None:
    counts = line_counts()
    stale = {path for path in explained_long_modules() if counts.get(path, 0) <= LIMIT}
    assert stale == set(), f"docs/architecture.md names these as longer modules, but they are not (any more): {stale}"

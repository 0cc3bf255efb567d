"""The documentation agrees with the tree: every module on docs/architecture.md, every decision in its
index with a status both sides of an amendment agree on, and every link leading to a file.

docs/architecture.md names each module by its path from the repository's root, in backticks
(`gateway/consent/stage.py`), in the module tables of its wing; a migration script is named by its
folder, `gateway/db/migrations/versions/`, and listed in the page's "Migrations" paragraph instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DECISIONS = DOCS / "decisions"
ARCHITECTURE = DOCS / "architecture.md"
MIGRATION_SCRIPTS = Path("gateway/db/migrations/versions")

FILE_NAME = re.compile(r"(\d{4})-[a-z0-9]+(?:-[a-z0-9]+)*\.md")
NUMBERS = r"\d+(?:, \d+)*"
STATUS = re.compile(rf"Status: (accepted|amended by {NUMBERS}|superseded by {NUMBERS})(?:; amends ({NUMBERS}))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def python_modules() -> list[Path]:
    """Every module under gateway/ and sandbox/, relative to the repository, migration scripts aside."""
    found = (path.relative_to(ROOT) for package in ("gateway", "sandbox") for path in (ROOT / package).rglob("*.py"))
    return sorted(path for path in found if MIGRATION_SCRIPTS not in path.parents)


def test_every_module_is_named_on_the_architecture_page() -> None:
    page = ARCHITECTURE.read_text()
    missing = [str(path) for path in python_modules() if f"`{path}`" not in page]
    assert missing == [], "give each a line in the module table of its wing on docs/architecture.md"


def test_every_module_the_architecture_page_names_exists() -> None:
    named = set(re.findall(r"`((?:gateway|sandbox)/[\w/]+\.py)`", ARCHITECTURE.read_text()))
    assert named, "the page names modules as `gateway/x.py`"
    assert sorted(path for path in named if not (ROOT / path).is_file()) == []


def decision_files() -> dict[int, Path]:
    files = {}
    for path in DECISIONS.glob("*.md"):
        if path.name == "README.md":
            continue
        match = FILE_NAME.fullmatch(path.name)
        assert match, f"{path.name}: a decision is NNNN-short-title.md, in kebab case"
        files[int(match[1])] = path
    return files


def numbers_in(text: str | None) -> set[int]:
    return {int(n) for n in text.split(", ")} if text else set()


def statuses() -> dict[int, tuple[str, set[int], set[int]]]:
    """Each decision's status line: its state, the decisions that changed it, those it changes."""
    found = {}
    for number, path in decision_files().items():
        title, blank, status, *_ = path.read_text().split("\n")
        assert re.fullmatch(rf"# {number}\. \S.*", title), f"{path.name} starts `# {number}. Title`"
        match = STATUS.fullmatch(status)
        assert blank == "" and match, f"{path.name}: the third line is `Status: ...` ({status!r})"
        state = match[1]
        found[number] = (state, numbers_in(state.partition(" by ")[2]), numbers_in(match[2]))
    return found


def test_the_decisions_are_numbered_without_duplicates() -> None:
    numbers = [int(path.name[:4]) for path in DECISIONS.glob("[0-9]*.md")]
    assert len(numbers) == len(set(numbers)) and 1 in numbers


def test_an_amendment_is_recorded_on_both_sides() -> None:
    found = statuses()
    later = {(old, new) for old, (_, by, _) in found.items() for new in by}
    earlier = {(old, new) for new, (_, _, amends) in found.items() for old in amends}
    assert sorted(later - earlier) == [], "(old, new): new does not say `amends old`"
    assert sorted(earlier - later) == [], "(old, new): old does not say `amended by new` or `superseded by new`"
    assert all(old < new for old, new in later), "a decision is changed only by a later one"


def test_an_amended_decision_says_what_no_longer_holds() -> None:
    for number, (state, _, _) in statuses().items():
        if state.startswith("amended"):
            assert "**Amended.**" in decision_files()[number].read_text()


def test_the_index_lists_every_decision_with_its_status() -> None:
    index = (DECISIONS / "README.md").read_text()
    rows = {
        int(number): (target, status)
        for number, target, status in re.findall(r"^\| (\d+) \| \[.*\]\(([^)]+)\) \| ([^|]+) \|$", index, re.M)
    }
    files = decision_files()
    assert sorted(rows) == sorted(files), "one row per decision in docs/decisions/README.md"
    for number, path in files.items():
        status = path.read_text().split("\n")[2].removeprefix("Status: ")
        assert rows[number] == (path.name, status), f"decision {number}'s row"


def markdown_files() -> Iterator[Path]:
    yield ROOT / "README.md"
    yield ROOT / "bench" / "README.md"
    yield from sorted(DOCS.rglob("*.md"))


@pytest.mark.parametrize("page", list(markdown_files()), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_leads_to_a_file(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:|#", target):
            continue
        if not (page.parent / target.partition("#")[0]).exists():
            broken.append(target)
    assert broken == []


def test_nothing_names_the_old_decisions_file() -> None:
    """docs/decisions.md became docs/decisions/, one file per decision: cite "decision 64"."""
    old = "decisions" + ".md"
    here = Path(__file__).resolve()
    texts = [ROOT / name for name in ("README.md", "policy.yaml", "Makefile", "pyproject.toml")]
    for folder in ("docs", "gateway", "sandbox", "tests", "bench", "examples"):
        texts += (path for path in (ROOT / folder).rglob("*") if path.suffix in {".md", ".py", ".yaml", ".toml"})
    naming = [str(path.relative_to(ROOT)) for path in texts if path != here and old in path.read_text()]
    assert naming == []

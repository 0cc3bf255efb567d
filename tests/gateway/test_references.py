"""Code, tests and benches cite only what a reader of the repository can open: a docs/ page or a decision.

A pointer to material outside it (the spec's sections, an issue and its items, research notes,
seeds, the team's shared folder) tells a reader nothing they can follow. Say the fact the pointer
stood for, or name the docs/ page or the decision ("decision 64") behind it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("gateway", "sandbox", "tests", "bench", ".ci", "Makefile")
TEXT_SUFFIXES = frozenset({".py", ".md", ".js", ".css", ".html", ".mako", ".yaml", ".toml", ".txt", ".sh", ""})

OUTSIDE = re.compile(
    r"""
    \bspec\ (?:sections?|§)                     # "spec section 4", "spec sections 4-6"
    | \bissues?\ \#?\d+                         # "issue 12", "issues 3, 14", "issue #5"
    | \b(?:items?|acceptance)\ \d+\b            # "item 10", "acceptance 3": an issue's parts
    | \bresearch\b                              # "research L6": notes kept outside
    | \bseeds?\ ?\d{3}\b | \bseed's\b           # "seed 004", "the seed's T-suite"
    | (?:\.\./|/work/)shared/                   # "../shared/spec/interface.md"
    | \bshared/(?:spec|research|seeds?|briefs?|style)\b
    """,
    re.IGNORECASE | re.VERBOSE,
)
WORDS = ("spec", "issue", "item", "acceptance", "research", "seed", "shared/")
"""A word that each of OUTSIDE's alternatives holds: a file or line without any is not searched (the pattern
over every line of the repository took 0.3 s of CPU, with the words first 0.1 s). A new alternative
needs its word here; the pattern's test runs its examples through `points_outside`, which looks for them."""


def points_outside(text: str) -> bool:
    folded = text.casefold()  # as IGNORECASE matches: the long s (U+017F) is an s to the pattern too
    return any(word in folded for word in WORDS) and OUTSIDE.search(text) is not None


def checked_files() -> list[Path]:
    found: list[Path] = []
    for name in CHECKED:
        top = ROOT / name
        if top.is_file():
            found.append(top)
            continue
        found.extend(
            path
            for path in top.rglob("*")
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts
        )
    return sorted(found)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def citations(path: Path) -> list[str]:
    """`file:line: text` for each line of `path` that points outside the repository."""
    text = path.read_text(encoding="utf-8", errors="replace")
    folded = text.casefold()
    if not any(word in folded for word in WORDS):
        return []
    return [
        f"{relative(path)}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if points_outside(line)
    ]


def test_the_pattern_finds_each_kind_of_outside_pointer_and_leaves_the_repositorys_own() -> None:
    outside = [
        "(spec section 4)",
        "spec sections 4-6",
        "(issue 12, item 10)",
        "issues 3, 14",
        "Issue 10, acceptance 3",
        "# --- item 5: budgets",
        "(issue 3; research L9)",
        "seed 004: R1-R5",
        "the seed's T-suite",
        "(spec: ../shared/spec/interface.md)",
        "/work/shared/research/notes.md",
    ]
    inside = [
        "(docs/security-model.md, layer 7)",
        "(decision 64)",
        "`mcp-gateway token issue NAME`",
        "allowed_paths: [shared/data]",
        "random.Random(seed)",
        "FUZZ_SEED",
        "an outside review's cases",
    ]
    assert [text for text in outside if not points_outside(text)] == []
    assert [text for text in inside if points_outside(text)] == []


def test_no_file_cites_material_outside_the_repository() -> None:
    here = Path(__file__).resolve()
    found = [line for path in checked_files() if path != here for line in citations(path)]
    assert found == [], "cite a docs/ page or a decision number, or say the fact:\n" + "\n".join(found)

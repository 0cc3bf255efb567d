"""File rules judge every tool that reads, lists or changes those files (decision 39), table by table.

`Read(...)` rules judge Read, NotebookRead, Grep, Glob and LS; `Edit(...)` rules Edit, MultiEdit,
Write and NotebookEdit. A search rooted inside a denied tree is denied; one whose folder holds
something a deny or ask rule names is asked, never allowed; an allow rule must cover the whole folder.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gateway.rules.files import _ancestry, _below, path_matches
from gateway.rules.permissions import Judgement, RuleSet, Verdict, judge, parse_rule

ROOT = "/srv/ws"
RULES = RuleSet.parse(
    ["Read(secrets/**)", "Edit(secrets/**)", "Read(.env)"],
    ["Read(config/private)"],
    ["Read(src/**)", "Edit(src/**)", "Grep", "Glob", "LS"],
)

# (tool, input, verdict, deciding rule)
CASES: list[tuple[str, dict[str, Any], str, str | None]] = [
    # one file read
    ("Read", {"file_path": f"{ROOT}/secrets/key.pem"}, "deny", "Read(secrets/**)"),
    ("Read", {"file_path": "secrets/deep/key.pem"}, "deny", "Read(secrets/**)"),
    ("Read", {"file_path": f"{ROOT}/.env"}, "deny", "Read(.env)"),
    ("Read", {"file_path": "config/private/db.yaml"}, "ask", "Read(config/private)"),  # a folder rule: all in it
    ("Read", {"file_path": f"{ROOT}/src/app.py"}, "allow", "Read(src/**)"),
    ("Read", {"file_path": f"{ROOT}/docs/a.md"}, "ask", None),
    ("Read", {"file_path": "~/.ssh/id_rsa"}, "ask", None),  # `~` is a home the gateway cannot see
    ("NotebookRead", {"notebook_path": f"{ROOT}/secrets/n.ipynb"}, "deny", "Read(secrets/**)"),
    ("NotebookRead", {"notebook_path": f"{ROOT}/src/n.ipynb"}, "allow", "Read(src/**)"),
    # Grep: a folder and all beneath it
    ("Grep", {"pattern": "key", "path": "secrets"}, "deny", "Read(secrets/**)"),
    ("Grep", {"pattern": "key", "path": f"{ROOT}/secrets/deep"}, "deny", "Read(secrets/**)"),
    ("Grep", {"pattern": "key", "path": f"{ROOT}/config/private"}, "ask", "Read(config/private)"),
    ("Grep", {"pattern": "key"}, "ask", "Read(secrets/**)"),  # the workspace holds secrets/
    ("Grep", {"pattern": "key", "path": "."}, "ask", "Read(secrets/**)"),
    ("Grep", {"pattern": "key", "path": ROOT}, "ask", "Read(secrets/**)"),
    ("Grep", {"pattern": "key", "path": "src"}, "allow", "Read(src/**)"),
    ("Grep", {"pattern": "key", "path": "src", "glob": "*.py"}, "allow", "Read(src/**)"),
    ("Grep", {"pattern": "key", "path": "docs"}, "allow", "Grep"),
    ("Grep", {"pattern": "key", "path": ".", "glob": "secrets/*.pem"}, "deny", "Read(secrets/**)"),
    ("Grep", {"pattern": "key", "path": ".", "glob": "**/*.py"}, "ask", "Read(secrets/**)"),
    ("Grep", {"pattern": "key", "path": "/"}, "ask", "Read(secrets/**)"),  # above the workspace
    ("Grep", {"pattern": "key", "path": "/usr/lib"}, "allow", "Grep"),  # beside it
    ("Grep", {"pattern": "key", "path": "src/../secrets"}, "deny", "Read(secrets/**)"),  # judged as resolved too
    # Glob: narrowed to the folders its pattern names literally
    ("Glob", {"pattern": "secrets/**"}, "deny", "Read(secrets/**)"),
    ("Glob", {"pattern": f"{ROOT}/secrets/*.pem"}, "deny", "Read(secrets/**)"),
    ("Glob", {"pattern": "*.pem", "path": f"{ROOT}/secrets"}, "deny", "Read(secrets/**)"),
    ("Glob", {"pattern": "**/*.py"}, "ask", "Read(secrets/**)"),
    ("Glob", {"pattern": "{secrets,src}/*"}, "ask", "Read(secrets/**)"),
    ("Glob", {"pattern": "s*/**"}, "ask", "Read(secrets/**)"),
    ("Glob", {"pattern": "../*", "path": ROOT}, "ask", "Read(secrets/**)"),
    ("Glob", {"pattern": "src/**/*.py"}, "allow", "Read(src/**)"),
    ("Glob", {"pattern": "*.py", "path": f"{ROOT}/src"}, "allow", "Read(src/**)"),
    ("Glob", {"pattern": "docs/*.md"}, "allow", "Glob"),
    ("Glob", {"pattern": "/etc/*"}, "allow", "Glob"),  # beside the workspace: a bare rule covers it
    # LS
    ("LS", {"path": ROOT}, "ask", "Read(secrets/**)"),
    ("LS", {}, "ask", "Read(secrets/**)"),
    ("LS", {"path": f"{ROOT}/secrets"}, "deny", "Read(secrets/**)"),
    ("LS", {"path": f"{ROOT}/src"}, "allow", "Read(src/**)"),
    ("LS", {"path": "/"}, "ask", "Read(secrets/**)"),
    ("LS", {"path": "/srv"}, "ask", "Read(secrets/**)"),
    ("LS", {"path": "~"}, "ask", "Read(secrets/**)"),
    ("LS", {"path": 7}, "ask", "Read(secrets/**)"),
    ("LS", {"path": "/usr/lib"}, "allow", "LS"),
    # every tool that changes a file
    ("Edit", {"file_path": f"{ROOT}/secrets/key.pem"}, "deny", "Edit(secrets/**)"),
    ("MultiEdit", {"file_path": f"{ROOT}/secrets/key.pem", "edits": []}, "deny", "Edit(secrets/**)"),
    ("Write", {"file_path": "secrets/new.pem"}, "deny", "Edit(secrets/**)"),
    ("NotebookEdit", {"notebook_path": f"{ROOT}/secrets/n.ipynb"}, "deny", "Edit(secrets/**)"),
    ("Write", {"file_path": f"{ROOT}/src/new.py"}, "allow", "Edit(src/**)"),
    ("MultiEdit", {"file_path": f"{ROOT}/src/app.py", "edits": []}, "allow", "Edit(src/**)"),
    ("NotebookEdit", {"notebook_path": f"{ROOT}/src/n.ipynb"}, "allow", "Edit(src/**)"),
    ("Edit", {"file_path": f"{ROOT}/.env"}, "ask", None),  # a Read rule does not judge edits
]


@pytest.mark.parametrize(("tool", "tool_input", "verdict", "rule"), CASES)
def test_file_rules_judge_every_tool_that_touches_the_file(
    tool: str, tool_input: dict[str, Any], verdict: Verdict, rule: str | None
) -> None:
    assert judge(RULES, tool, tool_input, ROOT, os.path.realpath) == Judgement(verdict, rule)


@pytest.mark.parametrize(
    ("deny", "tool", "tool_input", "verdict"),
    [
        ("Write(secrets/**)", "Edit", {"file_path": "secrets/a"}, "deny"),  # any rule of the family denies for all
        ("MultiEdit(secrets/**)", "NotebookEdit", {"notebook_path": "secrets/a"}, "deny"),
        ("NotebookRead(secrets/**)", "Grep", {"path": "secrets"}, "deny"),
        ("Read", "Grep", {"path": "/usr/lib"}, "deny"),  # a bare Read deny: no reading or listing at all
        ("Read", "LS", {"path": "src"}, "deny"),
        ("Read", "Edit", {"file_path": "src/a"}, "allow"),
        ("Grep", "Read", {"file_path": "src/a"}, "allow"),  # a bare Grep deny is about Grep only
        ("Grep", "Grep", {"path": "src"}, "deny"),
        ("Edit(secrets/**)", "Read", {"file_path": "secrets/a"}, "allow"),
    ],
)
def test_a_deny_or_ask_rule_judges_its_whole_family(
    deny: str, tool: str, tool_input: dict[str, Any], verdict: str
) -> None:
    rules = RuleSet.parse([deny], [], ["Read", "Edit", "Grep", "LS"])
    assert judge(rules, tool, tool_input, ROOT).verdict == verdict


@pytest.mark.parametrize(
    ("allow", "tool", "tool_input", "verdict"),
    [
        ("Read", "Grep", {"path": "."}, "allow"),  # Read covers its family
        ("Read", "Glob", {"pattern": "**"}, "allow"),
        ("Read", "LS", {"path": "/"}, "allow"),
        ("Read(**)", "Grep", {"path": "."}, "allow"),
        ("Read(**)", "Grep", {"path": "/"}, "ask"),  # the search would read beyond the workspace
        ("Read(src/**)", "Grep", {"path": "."}, "ask"),  # not the whole folder
        ("Read(src/*)", "Grep", {"path": "src"}, "ask"),  # not what is deeper
        ("Read(*/**)", "Grep", {"path": "src/pkg"}, "allow"),
        ("Edit", "Write", {"file_path": "/etc/passwd"}, "allow"),
        ("Write(src/**)", "Edit", {"file_path": "src/a"}, "ask"),  # only Read(...) and Edit(...) cover a family
        ("Grep", "Read", {"file_path": "src/a"}, "ask"),
        ("Edit(src/**)", "Read", {"file_path": "src/a"}, "ask"),
    ],
)
def test_an_allow_rule_covers_its_tool_and_read_or_edit_their_family(
    allow: str, tool: str, tool_input: dict[str, Any], verdict: str
) -> None:
    assert judge(RuleSet.parse([], [], [allow]), tool, tool_input, ROOT).verdict == verdict


def test_claude_codes_relative_spellings_mean_the_workspace() -> None:
    for spelling in ("Read(./secrets/**)", "Read(/secrets/**)"):
        rules = RuleSet.parse([spelling], [], ["Read"])
        assert judge(rules, "Read", {"file_path": f"{ROOT}/secrets/a"}, ROOT).verdict == "deny"
        assert judge(rules, "Grep", {"path": "secrets"}, ROOT).verdict == "deny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Read(//etc/**)", "relative to the workspace"),
        ("Read(~/.ssh/**)", "relative to the workspace"),
        ("Grep(src/**)", "takes no specifier"),
        ("LS(src)", "takes no specifier"),
    ],
)
def test_file_rules_that_cannot_be_judged_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rule(text)


def test_searches_are_judged_on_the_folders_links_lead_to(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "secrets").mkdir()
    (root / "src" / "keys").symlink_to(root / "secrets")
    (root / "src" / "up").symlink_to(tmp_path)
    rules = RuleSet.parse(["Read(secrets/**)"], [], ["Read(src/**)", "Grep", "Glob", "LS"])

    def verdict(tool: str, tool_input: dict[str, Any]) -> str:
        return judge(rules, tool, tool_input, str(root), os.path.realpath).verdict

    assert verdict("Grep", {"path": f"{root}/src/keys"}) == "deny"
    assert verdict("Glob", {"pattern": "src/keys/*.pem"}) == "deny"
    assert verdict("LS", {"path": f"{root}/src/keys"}) == "deny"
    assert verdict("Grep", {"path": "src", "glob": "keys/*"}) == "deny"
    assert verdict("Grep", {"path": f"{root}/src/up"}) == "ask"  # a link to the workspace's parent
    assert verdict("Grep", {"path": f"{root}/src"}) == "allow"


def _ancestry_by_pathlib(relative: str) -> list[str]:
    """What `_ancestry` gave when it built a PurePosixPath per folder: the result it must keep."""
    parts = PurePosixPath(relative).parts
    return [str(PurePosixPath(*parts[:n])) for n in range(len(parts), 0, -1)] or [relative]


@pytest.mark.parametrize(
    ("relative", "ancestry"),
    [
        ("a/b/c", ["a/b/c", "a/b", "a"]),
        ("a//b/./c", ["a/b/c", "a/b", "a"]),
        ("a", ["a"]),
        ("", [""]),
        (".", ["."]),
        ("/a/b", ["/a/b", "/a", "/"]),  # not workspace-relative: pathlib's root is kept
        ("//a/b", ["//a/b", "//a", "//"]),
    ],
)
def test_a_paths_ancestry_is_each_folder_above_it_as_pathlib_writes_it(relative: str, ancestry: list[str]) -> None:
    assert _ancestry(relative) == ancestry == _ancestry_by_pathlib(relative)


@pytest.mark.parametrize(
    ("spec", "relative", "below"),
    [
        ("src/**/x.py", "src/a", True),  # `**` may reach any folder beneath
        ("src/*.py", "src", True), ("src/*.py", "lib", False),
        ("a/b", "a/b/c", False),  # the glob ends above the folder: nothing beneath it matches
        ("a/b", "a/b", False),
    ],
)  # fmt: skip
def test_a_glob_may_match_beneath_a_folder_only_where_its_parts_reach(spec: str, relative: str, below: bool) -> None:
    assert _below(spec, relative) is below


@pytest.mark.parametrize(
    ("spec", "relative", "matches"),
    [("a?c", "abc", True), ("a?c", "a/c", False), ("a?c", "ac", False), ("?", "\n", True), ("a?", "a??", False)],
)
def test_a_question_mark_is_one_character_within_a_folder(spec: str, relative: str, matches: bool) -> None:
    assert path_matches(spec, relative) is matches

"""Claude Code permission rules, table by table: parsing, Bash compound commands, paths, domains, precedence."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.permission_rules import Judgement, RuleSet, bash_parts, judge, parse_rule

ROOT = "/srv/ws"


@pytest.mark.parametrize("text", ["Bash", "Bash(pytest:*)", "Bash(npm run test)", "Edit(src/**)", "Read",
                                  "WebFetch(domain:example.com)", "Write(docs/*.md)", "mcp__srv__tool"])  # fmt: skip
def test_rules_parse(text: str) -> None:
    assert parse_rule(text).text == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a rule"),
        ("Bash(", "is not a rule"),
        ("Bash()", "is not a rule"),
        ("Bash(  )", "empty specifier"),
        ("WebFetch(example.com)", "takes domain:HOST"),
        ("WebFetch(domain:)", "takes domain:HOST"),
        ("Task(anything)", "takes no specifier"),
        ("1Bash", "is not a rule"),
    ],
)
def test_bad_rules_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rule(text)


@pytest.mark.parametrize(
    ("command", "parts", "reliable"),
    [
        ("pytest -q", ["pytest -q"], True),
        ("pytest; rm -rf ~", ["pytest", "rm -rf ~"], True),
        ("pytest && curl http://x", ["pytest", "curl http://x"], True),
        ("pytest || echo no | tee log & sleep 1", ["pytest", "echo no", "tee log", "sleep 1"], True),
        ("pytest $(cat evil)", ["pytest $(cat evil)"], False),
        ("pytest `id`", ["pytest `id`"], False),
        ("diff <(a) <(b)", ["diff <(a) <(b)"], False),
        ("echo 'unbalanced", ["echo 'unbalanced"], False),
    ],
)
def test_bash_parts(command: str, parts: list[str], reliable: bool) -> None:
    assert bash_parts(command) == (parts, reliable)


ALLOW_PYTEST = RuleSet.parse([], [], ["Bash(pytest:*)"])


@pytest.mark.parametrize(
    ("command", "verdict"),
    [
        ("pytest", "allow"),
        ("pytest -q tests/", "allow"),
        ("pytest-evil", "ask"),  # a prefix is a word: pytest-evil is another command
        ("pytest; rm -rf ~", "ask"),
        ("pytest && curl http://x", "ask"),
        ("pytest $(rm -rf ~)", "ask"),
        ("pytest `rm -rf ~`", "ask"),
        ("pytest && pytest -x", "allow"),  # every part allowed
        ("FOO=1 pytest", "ask"),
    ],
)
def test_a_bash_allow_covers_a_command_only_if_every_part_matches(command: str, verdict: str) -> None:
    assert judge(ALLOW_PYTEST, "Bash", {"command": command}).verdict == verdict


@pytest.mark.parametrize(
    ("command", "verdict", "rule"),
    [
        ("rm -rf /", "deny", "Bash(rm:*)"),
        ("pytest; rm -rf ~", "deny", "Bash(rm:*)"),  # a deny anywhere in the command wins
        ("pytest $(x) && rm x", "deny", "Bash(rm:*)"),
        ("pytest", "allow", "Bash(pytest:*)"),
        ("git push", "ask", "Bash(git push:*)"),
        ("ls", "ask", None),
    ],
)
def test_deny_beats_ask_beats_allow(command: str, verdict: str, rule: str | None) -> None:
    ruleset = RuleSet.parse(["Bash(rm:*)"], ["Bash(git push:*)"], ["Bash(pytest:*)", "Bash(git:*)"])
    judged = judge(ruleset, "Bash", {"command": command})
    assert (judged.verdict, judged.rule) == (verdict, rule)


@pytest.mark.parametrize(
    ("tool", "tool_input", "verdict"),
    [
        ("Edit", {"file_path": f"{ROOT}/src/a.py"}, "allow"),
        ("Edit", {"file_path": f"{ROOT}/src/deep/er/a.py"}, "allow"),
        ("Edit", {"file_path": "src/a.py"}, "allow"),
        ("Edit", {"file_path": f"{ROOT}/tests/a.py"}, "ask"),
        ("Edit", {"file_path": "/etc/passwd"}, "ask"),  # outside the workspace
        ("Edit", {"file_path": f"{ROOT}/src/../../etc/passwd"}, "ask"),
        ("Edit", {}, "ask"),
        ("Write", {"file_path": f"{ROOT}/src/a.py"}, "ask"),  # the rule names Edit only
        ("Read", {"file_path": "/anything"}, "allow"),  # a bare tool name covers every use
        ("WebFetch", {"url": "https://example.com/x"}, "allow"),
        ("WebFetch", {"url": "https://EXAMPLE.com/x"}, "allow"),
        ("WebFetch", {"url": "https://evil.example.com.attacker.net/"}, "ask"),
        ("WebFetch", {"url": "https://sub.example.com/"}, "ask"),
    ],
)
def test_paths_and_domains(tool: str, tool_input: dict[str, Any], verdict: str) -> None:
    allow = RuleSet.parse([], [], ["Edit(src/**)", "Read", "WebFetch(domain:example.com)"])
    assert judge(allow, tool, tool_input, ROOT).verdict == verdict


def test_no_rule_means_ask() -> None:
    assert judge(RuleSet(), "Bash", {"command": "ls"}).verdict == "ask"


def test_a_file_rule_judges_the_path_as_written_and_as_resolved(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "secrets").mkdir()
    (root / "src" / "to_secrets").symlink_to(root / "secrets")
    (root / "docs").symlink_to(root / "src")
    rules = RuleSet.parse(["Edit(secrets/**)"], [], ["Edit(src/**)", "Edit(docs/**)"])
    through_link = {"file_path": f"{root}/src/to_secrets/key.pem"}
    # As written it is src/...: allowed by a lexical judge, denied once the link is followed.
    assert judge(rules, "Edit", through_link, str(root)).verdict == "allow"
    assert judge(rules, "Edit", through_link, str(root), os.path.realpath) == Judgement("deny", "Edit(secrets/**)")
    # A link within the allowed folders stays allowed: both forms are covered.
    assert judge(rules, "Edit", {"file_path": f"{root}/docs/a.md"}, str(root), os.path.realpath).verdict == "allow"
    # Out of the workspace through a link: no relative rule covers it.
    (root / "src" / "out").symlink_to(tmp_path)
    assert judge(rules, "Edit", {"file_path": f"{root}/src/out/x"}, str(root), os.path.realpath).verdict == "ask"


@pytest.mark.parametrize(
    "path",
    ["secrets/a\nb", "secrets/\n", "secrets/a\r\nb", "secrets/x\x85y", "secrets/deep/\n/key"],
    ids=["newline", "only-newline", "crlf", "nel", "newline-folder"],
)
def test_a_newline_in_a_path_does_not_slip_past_a_deny_glob(path: str) -> None:
    """Issue 10 item 9: a regex `.` stops at a newline; a glob's `**` must not."""
    rules = RuleSet.parse(["Edit(secrets/**)"], [], ["Edit(**)"])

    assert judge(rules, "Edit", {"file_path": path}, ROOT) == Judgement("deny", "Edit(secrets/**)")

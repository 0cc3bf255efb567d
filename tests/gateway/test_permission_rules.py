"""Claude Code permission rules, table by table: parsing, Bash compound commands, paths, domains, precedence."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.rules.permissions import Judgement, RuleSet, bash_parts, judge, parse_rule
from tests.bash_cases import DENIED, NEVER_ALLOWED, NOT_DENIED, STILL_ALLOWED

ROOT = "/srv/ws"
ALLOW_PYTEST = RuleSet.parse([], [], ["Bash(pytest:*)"])


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
    ("command", "parts", "eligible"),
    [
        ("pytest -q", ["pytest -q"], True),
        ("pytest; rm -rf x", ["pytest", "rm -rf x"], True),
        ("pytest && curl http://x", ["pytest", "curl http://x"], True),
        ("pytest || echo no | tee log\nsleep 1", ["pytest", "echo no", "tee log", "sleep 1"], True),
        ("pytest  -k\t'a  b'", ["pytest -k 'a  b'"], True),  # blanks between words become one space
        ("pytest; rm -rf ~", ["pytest", "rm -rf ~"], False),  # ~ is expanded
        ("pytest || echo no & sleep 1", ["pytest", "echo no", "sleep 1"], False),  # & runs in the background
        ("pytest $(cat evil)", ["pytest $(cat evil)"], False),
        ("pytest `id`", ["pytest `id`"], False),
        ("diff <(a) <(b)", ["diff <(a) <(b)"], False),
        ("echo 'unbalanced", ["echo 'unbalanced"], False),
    ],
)
def test_bash_parts(command: str, parts: list[str], eligible: bool) -> None:
    """Parts of an allow-eligible command; else the text cut at its separators (for `policy explain`)."""
    assert bash_parts(command) == (parts, eligible)


# --- an allow rule allows only plain commands of literal words -------------------------


@pytest.mark.parametrize("allow", ["Bash(pytest:*)", "Bash(pytest*)", "Bash(*)", "Bash"])
@pytest.mark.parametrize("command", NEVER_ALLOWED)
def test_no_allow_rule_allows_what_the_shell_would_expand_redirect_define_or_group(allow: str, command: str) -> None:
    """Even a bare `Bash` allow rule leaves these to a person: the command is not what it looks like."""
    assert judge(RuleSet.parse([], [], [allow]), "Bash", {"command": command}) == Judgement("ask", None)


@pytest.mark.parametrize("command", STILL_ALLOWED)
def test_plain_commands_of_literal_words_stay_allowed(command: str) -> None:
    assert judge(ALLOW_PYTEST, "Bash", {"command": command}) == Judgement("allow", "Bash(pytest:*)")


@pytest.mark.parametrize(
    ("rule", "command", "verdict"),
    [
        ("Bash(pytest -q)", "pytest -q", "allow"),
        ("Bash(pytest -q)", "pytest   -q", "allow"),  # blanks
        ("Bash(pytest -q)", "pytest -q -p evil", "ask"),  # exact means exact
        ("Bash(pytest -q)", "pytest '-q'", "ask"),  # quoted words are matched as written: ask, never a wrong allow
        ("Bash(git  status:*)", "git status -s", "allow"),  # blanks in the rule too
        ("Bash(npm run *)", "npm run test", "allow"),
        ("Bash(npm run *)", "npm run 'a; b'", "allow"),  # one literal argument: npm gets `a; b`
        ("Bash(npm run *)", "npm run a; rm b", "ask"),
        ("Bash(pytest:*)", "pytest' -q'", "ask"),
    ],
)
def test_allow_rules_match_the_words_as_written(rule: str, command: str, verdict: str) -> None:
    assert judge(RuleSet.parse([], [], [rule]), "Bash", {"command": command}).verdict == verdict


# --- a deny rule denies every way of running the program that can be read ---------------

DENY_RM = RuleSet.parse(["Bash(rm:*)"], [], ["Bash"])


@pytest.mark.parametrize("command", DENIED)
def test_a_deny_rule_sees_through_rewrites(command: str) -> None:
    """With `allow: [Bash]` too: the deny rule wins however rm is spelled, wrapped or nested."""
    assert judge(DENY_RM, "Bash", {"command": command}) == Judgement("deny", "Bash(rm:*)")


@pytest.mark.parametrize("command", NOT_DENIED)
def test_a_deny_rule_does_not_deny_what_only_mentions_the_program(command: str) -> None:
    assert judge(DENY_RM, "Bash", {"command": command}).verdict != "deny"


@pytest.mark.parametrize(
    ("rule", "command", "verdict"),
    [
        ("Bash(rm -rf:*)", "rm -rf x", "deny"),
        ("Bash(rm -rf:*)", "rm  -rf x", "deny"),
        ("Bash(rm -rf:*)", "rm\t-rf\tx", "deny"),
        ("Bash(rm -rf:*)", "rm '-rf' x", "deny"),
        ("Bash(rm -rf:*)", "sudo /bin/rm -rf x", "deny"),
        ("Bash(rm -rf:*)", "rm $FLAGS x", "deny"),  # an expansion may be -rf
        ("Bash(rm -rf:*)", "rm -r x", "ask"),
        ("Bash(rm -rf:*)", "rm -fr x", "ask"),  # another spelling of the same options: write Bash(rm:*)
        ("Bash(/bin/rm:*)", "rm x", "deny"),  # a rule naming a path names its program
        ("Bash(git push:*)", "git  push", "deny"),
        ("Bash(git push:*)", "command git 'push' origin", "deny"),
        ("Bash(git push:*)", "/usr/bin/git push", "deny"),
        ("Bash(git push:*)", "git status", "ask"),
        ("Bash(git status)", "env git status", "deny"),
        ("Bash(git status)", "git status -s", "ask"),
        ("Bash(curl *)", "sudo curl http://x", "deny"),
        ("Bash(curl *)", "x=$(curl http://x)", "deny"),
    ],
)
def test_deny_rules_with_several_words_and_globs(rule: str, command: str, verdict: str) -> None:
    assert judge(RuleSet.parse([rule], [], []), "Bash", {"command": command}).verdict == verdict


def test_an_ask_rule_sees_through_rewrites_as_a_deny_rule_does() -> None:
    rules = RuleSet.parse([], ["Bash(git push:*)"], ["Bash"])
    for command in ("git push", "env GIT_DIR=x git push", "bash -c 'git push'", "(git push)", "echo $(git push)"):
        assert judge(rules, "Bash", {"command": command}) == Judgement("ask", "Bash(git push:*)"), command


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
        ("Write", {"file_path": f"{ROOT}/src/a.py"}, "allow"),  # Edit(...) rules cover every tool that changes files
        ("Write", {"file_path": f"{ROOT}/tests/a.py"}, "ask"),
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
    """A regex `.` stops at a newline; a glob's `**` must not."""
    rules = RuleSet.parse(["Edit(secrets/**)"], [], ["Edit(**)"])

    assert judge(rules, "Edit", {"file_path": path}, ROOT) == Judgement("deny", "Edit(secrets/**)")

"""Reading a command is bounded (decision 71): past a bound the command is denied, naming the
bound and what to do, never asked about or allowed; within the bounds the reading is about linear.

Each hostile shape is timed: on the old readers a wrapper chain was quadratic (18 KB: 29 s), a
chain of unknown options exponential, brace expansion quadratic, and a glob with many stars
exponential in a regex. `time_limit` is generous (the machine is shared); the old code takes
minutes or hours on the same inputs.
"""

from __future__ import annotations

import os
import time

import pytest

from gateway.rules.permissions import RuleSet, judge
from gateway.rules.shell import read_invocations
from gateway.rules.shell.invocations import (
    MAX_COMMAND_CHARS,
    MAX_DEPTH,
    MAX_INVOCATIONS,
    MAX_TEXTS,
    MAX_WORDS,
    MAX_WORK,
    MAX_WRAPPERS,
)
from gateway.rules.shell.words import MAX_BRACE_CHARS

DENY_RM = RuleSet.parse(["Bash(rm:*)"], [], ["Bash"])
TIME_LIMIT_S = 10.0
"""Far above what the bounded readers take (under a second on one idle core). The bounds here are on the reading
thread's CPU time, not the wall clock: a busy machine (load 18) took 11 s of wall for a 10 s bound."""

WRAPPERS = [
    "env -u a ", "env A=1 ", "nice -n 1 ", "nice ", "timeout 1 ", "timeout -s KILL 5 ", "xargs ", "xargs -0 ",
    "command ", "builtin ", "exec ", "exec -a x ", "sudo ", "sudo -u root ", "doas ", "nohup ", "stdbuf -o0 ",
    "ionice -c 3 ", "chrt -f 1 ", "setsid ", "time ", "time -p ", "taskset 1 ", "flock f ", "busybox ",
    "strace -f ", "fakeroot ", "sudo -Q x ", "unbuffer ", "catchsegv ", "script -q ",
]  # fmt: skip


def judged(command: str) -> tuple[str, str | None, float]:
    started = time.thread_time()
    verdict = judge(DENY_RM, "Bash", {"command": command})
    return verdict.verdict, verdict.rule or verdict.unreadable, time.thread_time() - started


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("count", [1, 20, 3000])
def test_a_wrapper_chain_before_a_denied_program_is_denied_at_any_length(wrapper: str, count: int) -> None:
    verdict, why, took = judged(wrapper * count + "rm x")

    assert verdict == "deny", (count, why)
    assert took < TIME_LIMIT_S
    if count <= 20:
        assert why == "Bash(rm:*)"


def test_three_thousand_xargs_before_rm_is_denied_not_asked() -> None:
    verdict, why, _ = judged("xargs " * 3000 + "rm x")
    assert (verdict, why) == (
        "deny",
        f"it runs a command through more than {MAX_WRAPPERS} wrappers (env, sudo, xargs, ...)",
    )


@pytest.mark.parametrize(
    ("command", "bound"),
    [
        ("echo " + "a" * MAX_COMMAND_CHARS, f"over the {MAX_COMMAND_CHARS} the gateway reads"),
        ("echo " + "a;" * (1024 * 1024 // 2), f"over the {MAX_COMMAND_CHARS} the gateway reads"),
        ("echo " + "a " * MAX_WORDS, f"more than {MAX_WORDS} words"),
        ("a|" * MAX_WORDS + "b", f"more than {MAX_WORDS} words"),
        ("nice " * (MAX_WRAPPERS + 1) + "ls", f"more than {MAX_WRAPPERS} wrappers"),
        ("; ".join(f"p{i} x" for i in range(MAX_INVOCATIONS + 1)), f"more than {MAX_INVOCATIONS} programs"),
        ("$(" * (MAX_DEPTH + 2) + "ls" + ")" * (MAX_DEPTH + 2), f"more than {MAX_DEPTH} deep"),
        # just past the steps: nine texts of 16 KB, each inside the last (with 14,000 "a" it is read whole);
        # `eval ` x 4,000, the costliest reading, is in tests/gateway/test_server_permission_bounds.py
        ("eval " * 8 + "ls " + "a" * 16_000, "steps"),
        ("echo " + " ".join(f"'$(a{i})'" for i in range(MAX_TEXTS + 1)), f"more than {MAX_TEXTS} texts"),
        ("echo " + "{a,b}" * (MAX_BRACE_CHARS // 5 + 1), f"more than {MAX_BRACE_CHARS} characters holds braces"),
    ],
    ids=["long", "one-mebibyte", "words", "pipes", "wrappers", "programs", "depth", "work", "texts", "braces"],
)
def test_past_a_bound_the_command_is_denied_with_the_bound_named(command: str, bound: str) -> None:
    verdict, why, took = judged(command)

    assert verdict == "deny" and why is not None and bound in why, why
    assert took < TIME_LIMIT_S
    reading = read_invocations(command)
    assert reading.exceeded == why and not reading.complete and reading.invocations == ()


def test_the_work_bound_is_above_what_the_other_bounds_let_through() -> None:
    assert MAX_WORK >= 2 * MAX_COMMAND_CHARS


@pytest.mark.parametrize(
    "command",
    [
        "rm " + "*" * 3000 + "x",  # a regex of `.*` per star backtracks exponentially against a rule word
        "rm " + "*a" * 3000 + "-",
        "echo " + "{" * 2000 + "a,b" + "}" * 2000,  # brace matching restarted at every `{`
        "echo $'" + "\\101" * 8000 + "'",  # each escape sliced the rest of the text
        "a" + " " * (MAX_COMMAND_CHARS - 2) + "b",  # `\s*` around separators backtracks over blanks
        "find . " + "-exec " * 3000 + "rm x ;",
        "strace -f " * 30 + "ls",  # an unknown option read both ways at each wrapper: 2^30 readings
        "".join("{|"[(i * 7919 % 13) % 2] for i in range(30_000)),  # tree-sitter's error recovery: 2 s for 20 KB
    ],
    ids=[
        "stars",
        "star-letters",
        "nested-braces",
        "escapes",
        "blanks",
        "find-exec",
        "unknown-options",
        "grammar-errors",
    ],
)
def test_shapes_that_were_superlinear_read_in_bounded_time(command: str) -> None:
    rules = RuleSet.parse(["Bash(rm --no-preserve-root-of-the-system:*)"], [], ["Bash"])
    started = time.thread_time()
    judge(rules, "Bash", {"command": command})
    judge(DENY_RM, "Bash", {"command": command})
    assert time.thread_time() - started < TIME_LIMIT_S


@pytest.mark.parametrize(
    ("tool", "tool_input", "bound"),
    [
        ("Edit", {"file_path": "a/" * 256 + "x"}, "more than 256 parts"),
        ("Read", {"file_path": "/" + "a" * 4096}, "over the 4096"),
        ("Glob", {"pattern": "*/" * 300}, "more than 256 parts"),
        ("Grep", {"pattern": "x", "glob": "a/" * 300}, "its glob has more than 256 parts"),
        ("LS", {"path": "a" * 5000}, "over the 4096"),
    ],
)
def test_a_file_tool_path_past_a_bound_is_denied_with_the_bound_named(
    tool: str, tool_input: dict[str, str], bound: str
) -> None:
    rules = RuleSet.parse(["Edit(secrets/**)"], [], ["Read", "Edit", "Glob", "Grep", "LS"])
    verdict = judge(rules, tool, tool_input, "/srv/ws", os.path.realpath)
    assert verdict.verdict == "deny" and verdict.unreadable is not None and bound in verdict.unreadable, verdict


def test_a_deep_path_within_the_bounds_is_judged_quickly() -> None:
    """Each folder above a path is judged against each rule: 4,000 parts took 40 s before the bound."""
    rules = RuleSet.parse(["Edit(secrets/**)", "Read(**/.env)"], ["Edit(src/**)"], ["Edit(docs/**)", "Read"])
    started = time.thread_time()
    for tool in ("Edit", "Read"):
        assert judge(rules, tool, {"file_path": "/".join(["abcdefghijklmno"] * 255)}, "/srv/ws", os.path.realpath)
    assert time.thread_time() - started < TIME_LIMIT_S


def test_a_webfetch_url_past_the_bound_is_denied() -> None:
    rules = RuleSet.parse([], [], ["WebFetch(domain:example.com)"])
    long_url = "https://" + "a@" * 200_000 + "example.com/"  # every `@` was a host to read: over a second
    started = time.thread_time()
    verdict = judge(rules, "WebFetch", {"url": long_url})
    assert (verdict.verdict, verdict.unreadable) == (
        "deny",
        f"its url is {len(long_url)} characters long, over the 8192 the gateway judges",
    )
    assert time.thread_time() - started < 1.0
    assert judge(rules, "WebFetch", {"url": "https://example.com/" + "a" * 8000}).verdict == "allow"

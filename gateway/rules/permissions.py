"""Claude Code permission rules (docs/claude-code.md, "Rules"): parsing, and the pure verdict for one tool use.

Rules use Claude Code's syntax: `Tool` (every use of the tool), `Bash(prefix:*)` (a command
that is the prefix or starts with it and a space), `Bash(exact command)`, `Edit(src/**)` and
the other file tools with a path glob (relative to the workspace, `**` for any depth),
`WebFetch(domain:host)` (that host exactly, any letter case). Deny wins over ask over allow;
no match means ask.

A Bash command is read twice (gateway/rules/shell/), within bounds (length, words, nesting, wrappers,
work): a command past a bound is denied, whatever the rules say. For deny and ask rules, every program it runs that
can be read (inside substitutions, subshells, groups, compound commands, `bash -c` and `eval`
strings, through wrappers such as `env`, `sudo`, `xargs`, `find -exec`, with assignments, quoting,
paths and blanks seen through): a deny or ask rule that matches any of them applies. For allow
rules, the command must be plain literal commands cut at `;`, `&&`, `||`, `|` and newlines, each a
command word and literal words with nothing the shell expands, redirects, defines or groups;
an allow rule applies only if every part matches an allow rule. Anything else is never allowed
by a rule (it is asked about, or denied).

A file path is judged as written and, when `judge` is given `realpath`, as the file it really
is (symlinks followed): a deny or ask rule applies if it matches either, and allow rules must
cover both. So `Edit(src/**)` never covers `src/link` pointing out of `src/`. `Read(...)` rules also
judge Grep, Glob and LS, `Edit(...)` rules every tool that changes a file (gateway/rules/files.py).

A WebFetch URL's host is read as Claude Code's fetcher (Node, WHATWG) reads it, and every other
plausible way: a deny or ask rule matches if any reading is its host; an allow rule only a plain URL
whose WHATWG host is its host (gateway/rules/hosts.py).
"""

from __future__ import annotations

import fnmatch
import functools
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.rules.files import PATH_ARGUMENT, PATH_RULE_TOOLS, FileUse, check_path_spec, covers, file_use, touches
from gateway.rules.hosts import check_domain, is_rule_host, reaches_rule_host, read_host
from gateway.rules.shell import Invocation, Reading, literal_commands, read_invocations

Verdict = Literal["deny", "ask", "allow"]
FILE_TOOLS = PATH_RULE_TOOLS
"""The tools whose rules take a path glob; file rules judge every tool in PATH_ARGUMENT."""
_RULE = re.compile(r"^(?P<tool>[A-Za-z][A-Za-z0-9_]*)(?:\((?P<spec>.+)\))?$")


@dataclass(frozen=True, slots=True)
class Rule:
    text: str
    tool: str
    spec: str | None


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    rule: str | None
    """The rule that decided; None when no rule matched (ask) or the command could not be read (deny)."""
    unreadable: str | None = None
    """Set on a deny because a Bash command is past a bound of its reading: which bound, in words."""


def parse_rule(text: str) -> Rule:
    """One rule, or ValueError saying what is wrong with it."""
    match = _RULE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a rule: write Tool or Tool(specifier)")
    tool, spec = match.group("tool"), match.group("spec")
    if spec is not None:
        spec = spec.strip()
        if not spec:
            raise ValueError(f"{text!r} has an empty specifier")
        if tool == "WebFetch" and not (spec.startswith("domain:") and len(spec) > len("domain:")):
            raise ValueError(f"{text!r}: WebFetch takes domain:HOST")
        if tool not in ("Bash", "WebFetch", *FILE_TOOLS):
            raise ValueError(f"{text!r}: {tool} takes no specifier (only Bash, WebFetch and file tools do)")
        try:
            if tool == "WebFetch":
                check_domain(spec.removeprefix("domain:"))
            elif tool in FILE_TOOLS:
                check_path_spec(spec)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {tool} {exc}") from None
    return Rule(text, tool, spec)


def bash_parts(command: str) -> tuple[list[str], bool]:
    """The command's parts, and whether allow rules may judge it: only if every part is a plain
    command of literal words (gateway/rules/shell/literal.py) and the deny side could read all of it.
    Parts of an eligible command are its words joined by one space; else the text cut at its
    separators."""
    literal = literal_commands(command)
    reading = _reading(command)
    if literal is not None and reading.complete:
        return [part.text for part in literal], True
    return list(reading.parts), False


_reading: Callable[[str], Reading] = functools.lru_cache(maxsize=32)(read_invocations)
"""Each deny and ask rule asks about the same command: read it once."""


def bash_programs(command: str) -> list[str]:
    """What deny and ask rules are matched against: each program the command runs that could be read,
    with its arguments (an expansion shown as `?`)."""
    return [invocation.text for invocation in _reading(command).invocations]


def _bash_part_matches(spec: str | None, part: str) -> bool:
    """An allow rule against one part of an eligible command (its words joined by one space)."""
    if spec is None:
        return True
    if spec.endswith(":*"):
        prefix = " ".join(spec[:-2].split())
        return part == prefix or part.startswith(prefix + " ")
    if "*" in spec:
        return fnmatch.fnmatchcase(part, spec)
    return part == " ".join(spec.split())


def _bash_touches(spec: str | None, command: str) -> bool:
    """Whether a deny or ask rule matches any program the command runs; where the reading is
    incomplete, also any part of the text cut at its separators (blanks as written, or each run of
    blanks as one space). A complete reading does not need the cut: it would take a line of a
    here-document (a commit message saying "rm is gone") for a command."""
    if spec is None:
        return True
    reading = _reading(command)
    parts = () if reading.complete else reading.parts
    if any(_bash_part_matches(spec, p) or _bash_part_matches(spec, " ".join(p.split())) for p in parts):
        return True
    if spec.endswith(":*") or "*" not in spec:
        whole = not spec.endswith(":*")
        for words in _rule_words(spec.removesuffix(":*") if not whole else spec):
            if any(_invokes(i, words, whole=whole) for i in reading.invocations):
                return True
        return False
    return any(i.fits(spec) or i.fits(" ".join(spec.split())) for i in reading.invocations)


def _invokes(invocation: Invocation, words: Sequence[str], *, whole: bool) -> bool:
    return invocation.equals(words) if whole else invocation.starts_with(words)


def _rule_words(text: str) -> list[list[str]]:
    """A rule's words as the shell would split them (`Bash(git commit -m 'wip':*)`); a rule naming
    a program by its path (`Bash(/bin/rm:*)`) also names its file name."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    if not words:
        return []
    named = [words]
    if "/" in words[0].rstrip("/"):
        named.append([words[0].rstrip("/").rsplit("/", 1)[1], *words[1:]])
    return named


def _host_matches(spec: str, url: object, *, exactly: bool) -> bool:
    """`exactly` (allow): a plain URL whose WHATWG host is the rule's; else any plausible reading of its host."""
    if not isinstance(url, str):
        return False
    reading, domain = read_host(url), spec.removeprefix("domain:")
    return is_rule_host(domain, reading) if exactly else reaches_rule_host(domain, reading)


def _matches(rule: Rule, tool: str, tool_input: Mapping[str, Any]) -> bool:
    """Whether a deny or ask `rule` touches this use: for Bash some part of the command, for WebFetch
    some reading of the URL's host."""
    if rule.tool != tool:
        return False
    if rule.spec is None:
        return True
    if tool == "Bash":
        return _bash_touches(rule.spec, str(tool_input.get("command", "")))
    if tool == "WebFetch":
        return _host_matches(rule.spec, tool_input.get("url"), exactly=False)
    return False


def _allowed(rules: Sequence[Rule], tool: str, tool_input: Mapping[str, Any]) -> Rule | None:
    """The allow rule covering the whole use: for Bash the command must be plain literal commands
    (`bash_parts`) and every part covered (each by some rule); the rule covering the first part is named."""
    mine = [r for r in rules if r.tool == tool]
    if tool == "WebFetch":
        url = tool_input.get("url")
        return next((r for r in mine if r.spec is None or _host_matches(r.spec, url, exactly=True)), None)
    if tool != "Bash":
        return next((r for r in mine if r.spec is None), None)
    parts, eligible = bash_parts(str(tool_input.get("command", "")))
    if not eligible or not parts:
        return None
    covering: Rule | None = None
    for part in parts:
        rule = next((r for r in mine if _bash_part_matches(r.spec, part)), None)
        if rule is None:
            return None
        covering = covering or rule
    return covering


@dataclass(frozen=True, slots=True)
class RuleSet:
    deny: tuple[Rule, ...] = ()
    ask: tuple[Rule, ...] = ()
    allow: tuple[Rule, ...] = ()

    @classmethod
    def parse(cls, deny: Sequence[str], ask: Sequence[str], allow: Sequence[str]) -> RuleSet:
        return cls(*(tuple(parse_rule(t) for t in texts) for texts in (deny, ask, allow)))


def judge(
    rules: RuleSet,
    tool: str,
    tool_input: Mapping[str, Any],
    root: str | None = None,
    realpath: Callable[[str], str] | None = None,
) -> Judgement:
    """deny > ask > allow; no match: ask. `realpath` (e.g. os.path.realpath) adds the resolved path."""
    if tool in PATH_ARGUMENT:
        too_long = _unreadable_path(tool, tool_input)
        if too_long is not None:
            return Judgement("deny", None, too_long)
        return _judge_files(rules, file_use(tool, tool_input, root, realpath))
    url = tool_input.get("url")
    if tool == "WebFetch" and isinstance(url, str) and len(url) > MAX_URL_CHARS:
        return Judgement(
            "deny", None, f"its url is {len(url)} characters long, over the {MAX_URL_CHARS} the gateway judges"
        )
    if tool == "Bash":
        exceeded = _reading(str(tool_input.get("command", ""))).exceeded
        if exceeded is not None:  # what the gateway cannot read in bounded time it never lets through
            return Judgement("deny", None, exceeded)
    for verdict, listed in (("deny", rules.deny), ("ask", rules.ask)):
        hit = next((r for r in listed if _matches(r, tool, tool_input)), None)
        if hit is not None:
            return Judgement(verdict, hit.text)  # type: ignore[arg-type]
    allowed = _allowed(rules.allow, tool, tool_input)
    if allowed is not None:
        return Judgement("allow", allowed.text)
    return Judgement("ask", None)


MAX_URL_CHARS = 8192
"""The longest WebFetch URL judged (each `@` in its authority is one more host to read): longer is denied."""
MAX_PATH_CHARS = 4096
"""The longest path (or Glob pattern, Grep glob) judged, Linux's PATH_MAX: a longer one is denied."""
MAX_PATH_PARTS = 256
"""The most `/`-separated parts a path may have: each folder above a path is judged against each rule."""


def _unreadable_path(tool: str, tool_input: Mapping[str, Any]) -> str | None:
    """Why a file tool's path is past a bound of judging (None: within them)."""
    for name in dict.fromkeys((PATH_ARGUMENT[tool], "pattern", "glob")):
        value = tool_input.get(name)
        if not isinstance(value, str):
            continue
        if len(value) > MAX_PATH_CHARS:
            return f"its {name} is {len(value)} characters long, over the {MAX_PATH_CHARS} the gateway judges"
        if value.count("/") >= MAX_PATH_PARTS:
            return f"its {name} has more than {MAX_PATH_PARTS} parts separated by /"
    return None


def _judge_files(rules: RuleSet, use: FileUse) -> Judgement:
    """deny > ask for rules reaching inside what the use touches; then a folder search holding something
    a deny or ask rule names is asked; then allow rules must cover every form (each by some rule)."""
    for verdict, listed in (("deny", rules.deny), ("ask", rules.ask)):
        hit = next((r for r in listed if touches(r.tool, r.spec, use) == "inside"), None)
        if hit is not None:
            return Judgement(verdict, hit.text)  # type: ignore[arg-type]
    below = next((r for r in (*rules.deny, *rules.ask) if touches(r.tool, r.spec, use) == "below"), None)
    if below is not None:
        return Judgement("ask", below.text)
    by_place = [next((r for r in rules.allow if covers(r.tool, r.spec, use, p)), None) for p in use.places]
    if by_place and all(by_place):
        return Judgement("allow", by_place[0].text)  # type: ignore[union-attr]
    return Judgement("ask", None)

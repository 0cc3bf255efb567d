"""Claude Code permission rules (spec section 9): parsing, and the pure verdict for one tool use.

Rules use Claude Code's syntax: `Tool` (every use of the tool), `Bash(prefix:*)` (a command
that is the prefix or starts with it and a space), `Bash(exact command)`, `Edit(src/**)` and
the other file tools with a path glob (relative to the workspace, `**` for any depth),
`WebFetch(domain:host)` (that host exactly, any letter case). Deny wins over ask over allow;
no match means ask.

A Bash command is judged part by part: it is cut at `;`, `&&`, `||`, `|`, `&` and newlines.
A deny or ask rule that matches any part applies; an allow rule applies only if every part
matches an allow rule. A command holding `$(`, backticks, `<(`, `>(` or an unbalanced quote
cannot be cut reliably, so no allow rule matches it (it is asked about, or denied by a rule
matching one of its visible parts).

A file path is judged as written and, when `judge` is given `realpath`, as the file it really
is (symlinks followed): a deny or ask rule applies if it matches either, and allow rules must
cover both. So `Edit(src/**)` never covers `src/link` pointing out of `src/`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal
from urllib.parse import urlsplit

Verdict = Literal["deny", "ask", "allow"]
FILE_TOOLS = {"Edit": "file_path", "MultiEdit": "file_path", "Write": "file_path", "Read": "file_path",
              "NotebookEdit": "notebook_path"}  # fmt: skip
_RULE = re.compile(r"^(?P<tool>[A-Za-z][A-Za-z0-9_]*)(?:\((?P<spec>.+)\))?$")
_SEPARATORS = re.compile(r"\s*(?:&&|\|\||;|\||&|\n)\s*")
_OPAQUE = ("$(", "`", "<(", ">(")


@dataclass(frozen=True, slots=True)
class Rule:
    text: str
    tool: str
    spec: str | None


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    rule: str | None
    """The rule that decided; None when no rule matched (ask)."""


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
    return Rule(text, tool, spec)


def bash_parts(command: str) -> tuple[list[str], bool]:
    """The command cut at its separators, and whether that cut can be trusted."""
    reliable = not any(token in command for token in _OPAQUE) and command.count("'") % 2 == 0
    reliable = reliable and command.count('"') % 2 == 0
    parts = [p.strip() for p in _SEPARATORS.split(command) if p.strip()]
    return parts, reliable


def _bash_part_matches(spec: str | None, part: str) -> bool:
    if spec is None:
        return True
    if spec.endswith(":*"):
        prefix = spec[:-2].strip()
        return part == prefix or part.startswith(prefix + " ")
    if "*" in spec:
        return fnmatch.fnmatchcase(part, spec)
    return part == spec


def path_forms(value: object, root: str | None, realpath: Callable[[str], str] | None) -> list[str | None]:
    """The path relative to the workspace as written and (with `realpath`) as resolved; None for a
    form outside the workspace or holding `..`, which no relative rule covers."""
    if not isinstance(value, str) or not value:
        return [None]
    forms = [_relative(PurePosixPath(value), root)]
    if realpath is not None and root:
        absolute = value if value.startswith("/") else f"{root.rstrip('/')}/{value}"
        forms.append(_relative(PurePosixPath(realpath(absolute)), realpath(root)))
    return forms


def _relative(path: PurePosixPath, root: str | None) -> str | None:
    if path.is_absolute() and root:
        try:
            path = path.relative_to(root)
        except ValueError:
            return None
    return None if ".." in path.parts else str(path)


def _path_matches(spec: str, form: str | None) -> bool:
    if form is None:
        return False
    path = PurePosixPath(form)
    return path.full_match(spec) if hasattr(path, "full_match") else _glob(spec, form)


def _glob(pattern: str, path: str) -> bool:
    """`**` any number of folders, `*` and `?` within one (Python < 3.13 has no PurePath.full_match)."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        elif pattern[i] == "?":
            regex, i = regex + "[^/]", i + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.fullmatch(regex, path, re.DOTALL) is not None  # a newline in a path is one more character


def _host_matches(spec: str, url: object) -> bool:
    if not isinstance(url, str):
        return False
    host = (urlsplit(url).hostname or "").lower()
    return host == spec.removeprefix("domain:").lower()


def _matches(rule: Rule, tool: str, tool_input: Mapping[str, Any], forms: Sequence[str | None]) -> bool:
    """Whether `rule` touches this use: for Bash some part of the command, for a file any form of its path."""
    if rule.tool != tool:
        return False
    if rule.spec is None:
        return True
    if tool == "Bash":
        parts, _ = bash_parts(str(tool_input.get("command", "")))
        return any(_bash_part_matches(rule.spec, p) for p in parts)
    if tool == "WebFetch":
        return _host_matches(rule.spec, tool_input.get("url"))
    return any(_path_matches(rule.spec, form) for form in forms)


def _allowed(
    rules: Sequence[Rule], tool: str, tool_input: Mapping[str, Any], forms: Sequence[str | None]
) -> Rule | None:
    """The allow rule covering the whole use: for Bash every part, for a file every form of its path
    must be covered (each by some rule); the rule covering the first part or form is named."""
    mine = [r for r in rules if r.tool == tool]
    if tool in FILE_TOOLS:
        by_form = [next((r for r in mine if r.spec is None or _path_matches(r.spec, f)), None) for f in forms]
        return by_form[0] if all(by_form) else None
    if tool != "Bash":
        return next((r for r in mine if _matches(r, tool, tool_input, forms)), None)
    parts, reliable = bash_parts(str(tool_input.get("command", "")))
    if not reliable or not parts:
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
    forms = path_forms(tool_input.get(FILE_TOOLS[tool]), root, realpath) if tool in FILE_TOOLS else []
    for verdict, listed in (("deny", rules.deny), ("ask", rules.ask)):
        hit = next((r for r in listed if _matches(r, tool, tool_input, forms)), None)
        if hit is not None:
            return Judgement(verdict, hit.text)  # type: ignore[arg-type]
    allowed = _allowed(rules.allow, tool, tool_input, forms)
    if allowed is not None:
        return Judgement("allow", allowed.text)
    return Judgement("ask", None)

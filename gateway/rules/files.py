"""Claude Code's file rules (docs/claude-code.md; decision 39): what a tool use reads or changes, and
whether a rule's path glob touches or covers it.

Claude Code applies `Edit(...)` rules to every tool that changes files and `Read(...)` rules to every
tool that reads or lists them. Here:

- Edit, MultiEdit, Write and NotebookEdit change one file, Read and NotebookRead read one; Grep, Glob
  and LS read a folder and everything under it (their `path`; the workspace when absent; for Glob,
  narrowed to the literal folders its `pattern` starts with).
- A deny or ask rule naming a tool of a family (`Read`/`NotebookRead`, or `Edit`/`MultiEdit`/
  `Write`/`NotebookEdit`) judges every tool of that family. An allow rule judges its own tool, and
  `Read(...)` / `Edit(...)` their whole family, as in Claude Code.
- A path is judged as written and, with `realpath`, as resolved (symlinks followed), relative to the
  workspace. A form outside it, holding `..` that leaves it, or starting with `~` is covered by no
  relative rule (only a bare `Read`/`Edit`/...).
- One file: a deny or ask rule touches it if its glob matches the path or a folder above it
  (`Read(secrets)` is the folder and what is in it); an allow rule must match every form.
- A folder (Grep, Glob, LS): a deny or ask rule whose glob matches the folder or one above it touches
  it "inside" (deny, or ask); one that may match something beneath it touches it "below": the answer
  is then ask, never allow, since the search would read into that tree. An allow rule must cover
  everything beneath every form (`Read(src/**)` covers `src` and `src/pkg`, not `.`). A folder
  outside the workspace that holds it (`/`, the workspace's parent) is below every rule. Grep's
  `glob` is judged by deny and ask rules as a folder too, conservatively.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

READERS = ("Read", "NotebookRead", "Grep", "Glob", "LS")
EDITORS = ("Edit", "MultiEdit", "Write", "NotebookEdit")
PATH_ARGUMENT = {"Read": "file_path", "NotebookRead": "notebook_path", "Grep": "path", "Glob": "path", "LS": "path",
                 "Edit": "file_path", "MultiEdit": "file_path", "Write": "file_path", "NotebookEdit": "notebook_path"}  # fmt: skip
"""Every tool file rules judge, and the argument naming its file or folder."""
PATH_RULE_TOOLS = ("Read", "NotebookRead", *EDITORS)
"""The tools whose rules take a path glob: `Read(secrets/**)`, `Edit(src/**)`."""
_TREES = ("Grep", "Glob", "LS")
_FAMILY_HEADS = {"Read": READERS, "Edit": EDITORS}
_MAGIC = re.compile(r"[*?\[\]{}()!+@\\~]")

Touch = Literal["inside", "below"]


@dataclass(frozen=True, slots=True)
class Place:
    relative: str | None
    """The path relative to the workspace (`.` is the workspace); None outside it or unknown."""
    holds_workspace: bool = False
    """A folder outside the workspace that holds it, or may (a `..` or `~` path)."""


@dataclass(frozen=True, slots=True)
class FileUse:
    tool: str
    tree: bool
    """A folder and everything beneath it (Grep, Glob, LS), not one file."""
    places: tuple[Place, ...]
    """What the use reads or changes, as written and as resolved: judged by every rule."""
    hints: tuple[Place, ...] = ()
    """Where Grep's `glob` points: judged by deny and ask rules only."""


def check_path_spec(spec: str) -> None:
    """Raise ValueError unless `spec` is a path glob relative to the workspace."""
    if spec.startswith(("//", "~")):
        raise ValueError("takes a path relative to the workspace (// and ~ paths are not supported)")


def file_use(
    tool: str, tool_input: Mapping[str, Any], root: str | None, realpath: Callable[[str], str] | None
) -> FileUse:
    """What a use of one of the tools in PATH_ARGUMENT touches."""
    value = tool_input.get(PATH_ARGUMENT[tool])
    if tool not in _TREES:
        return FileUse(tool, False, _places(value, root, realpath, tree=False))
    if value is None or value == "":
        value = "."  # Claude Code searches its working folder, the workspace
    hints: tuple[Place, ...] = ()
    if tool == "Glob" and isinstance(value, str):
        value = _join(value, _literal_prefix(tool_input.get("pattern")))
    elif tool == "Grep" and isinstance(value, str) and _literal_prefix(tool_input.get("glob")):
        hints = _places(_join(value, _literal_prefix(tool_input.get("glob"))), root, realpath, tree=True)
    return FileUse(tool, True, _places(value, root, realpath, tree=True), hints)


def touches(rule_tool: str, spec: str | None, use: FileUse) -> Touch | None:
    """Deny and ask side: whether a rule reaches this use: "inside" (the use is within what it names),
    "below" (a folder searched holds something it may name), or None."""
    if not _judges(rule_tool, use.tool, allow=False):
        return None
    if spec is None:
        return "inside"
    spec = _relative_spec(spec)
    for place in (*use.places, *use.hints):
        if place.relative is not None and (_inside(spec, place.relative) or _covers_tree(spec, place.relative)):
            return "inside"  # (a folder: what the rule names is the folder and all beneath it)
    if use.tree:
        for place in use.places:
            relative = "." if place.relative is None and place.holds_workspace else place.relative
            if relative is not None and _below(spec, relative):
                return "below"
    return None


def covers(rule_tool: str, spec: str | None, use: FileUse, place: Place) -> bool:
    """Allow side: whether a rule covers this form of the use whole (a folder with all beneath it)."""
    if not _judges(rule_tool, use.tool, allow=True):
        return False
    if spec is None:
        return True
    if place.relative is None:
        return False
    spec = _relative_spec(spec)
    if use.tree:
        return _covers_tree(spec, place.relative)
    return path_matches(spec, place.relative)


def _judges(rule_tool: str, tool: str, *, allow: bool) -> bool:
    if rule_tool == tool:
        return True
    if allow:
        return tool in _FAMILY_HEADS.get(rule_tool, ())
    return rule_tool in PATH_RULE_TOOLS and any(rule_tool in f and tool in f for f in (READERS, EDITORS))


def _relative_spec(spec: str) -> str:
    """Claude Code's `./path` and `/path` (from the project root) are both relative to the workspace."""
    return spec.removeprefix("./").removeprefix("/") if not spec.startswith("//") else spec


def _places(value: object, root: str | None, realpath: Callable[[str], str] | None, *, tree: bool) -> tuple[Place, ...]:
    if not isinstance(value, str) or not value or value.startswith("~"):
        return (Place(None, holds_workspace=tree),)  # Claude Code expands `~` to a home the gateway cannot see
    places = [_place(PurePosixPath(value), PurePosixPath(root) if root else None, tree)]
    if realpath is not None and root:
        absolute = value if value.startswith("/") else f"{root.rstrip('/')}/{value}"
        places.append(_place(PurePosixPath(realpath(absolute)), PurePosixPath(realpath(root)), tree))
    return tuple(places)


def _place(path: PurePosixPath, root: PurePosixPath | None, tree: bool) -> Place:
    relative = path
    if path.is_absolute():
        if root is None or not path.is_relative_to(root):
            holds = tree and (root is None or ".." in path.parts or root.is_relative_to(path))
            return Place(None, holds)
        relative = path.relative_to(root)
    if ".." in relative.parts:
        return Place(None, tree)
    return Place(str(relative))


def _literal_prefix(pattern: object) -> str:
    """The folders a glob pattern names literally before its first wildcard (`src/**/*.py`: `src`)."""
    if not isinstance(pattern, str):
        return ""
    literal = []
    for part in pattern.split("/"):
        if _MAGIC.search(part):
            break
        literal.append(part)
    return "/".join(literal).rstrip("/") or ("/" if pattern.startswith("/") else "")


def _join(base: str, prefix: str) -> str:
    if not prefix:
        return base
    if prefix.startswith("/"):
        return prefix
    return f"{base.rstrip('/')}/{prefix}" if base else prefix


def _ancestry(relative: str) -> list[str]:
    """The path and every folder above it within the workspace (`a/b/c`: `a/b/c`, `a/b`, `a`). The parts
    are joined as strings: a PurePosixPath per folder parsed the whole path again (quadratic in its parts)."""
    path = PurePosixPath(relative)
    parts = path.parts
    if path.anchor:  # not a workspace-relative path: pathlib writes its root (`/`, `//`)
        return [str(PurePosixPath(*parts[:n])) for n in range(len(parts), 0, -1)]
    return ["/".join(parts[:n]) for n in range(len(parts), 0, -1)] or [relative]


def _inside(spec: str, relative: str) -> bool:
    return any(path_matches(spec, a) for a in _ancestry(relative))


def _below(spec: str, relative: str) -> bool:
    """Whether the glob may match something strictly beneath the folder `relative`."""
    wanted = spec.split("/")
    parts = [] if relative == "." else PurePosixPath(relative).parts
    for i, part in enumerate(parts):
        if i >= len(wanted):
            return False
        if "**" in wanted[i]:
            return True
        if not path_matches(wanted[i], part):
            return False
    return len(wanted) > len(parts)


def _covers_tree(spec: str, relative: str) -> bool:
    """Whether the glob matches everything beneath `relative`: `**`, or `X/**` with X matching it or a folder above."""
    if spec == "**":
        return True
    if not spec.endswith("/**"):
        return False
    head = spec[:-3]
    return relative != "." and any(path_matches(head, a) for a in _ancestry(relative))


def path_matches(spec: str, relative: str) -> bool:
    if not hasattr(PurePosixPath, "full_match"):  # Python < 3.13: no PurePosixPath to build (each parses the path)
        return _glob(spec, relative)
    path = PurePosixPath(relative)
    return path.full_match(spec) if hasattr(path, "full_match") else _glob(spec, relative)


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
